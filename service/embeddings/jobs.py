"""The embeddings feature's jobs (registered in service/jobs/registry.py by the runner)."""

from __future__ import annotations

from service.embeddings.operations import REEMBED
from service.embeddings.reembed import reembed_batch
from service.jobs.declare import Job

REEMBED_JOB = Job(REEMBED, reembed_batch, needs=frozenset({"read", "write"}))
"""Re-embeds rows another model embedded (service/embeddings/reembed.py)."""

__all__ = ["REEMBED_JOB"]
