"""The consolidation job, for the runner's registry (service/jobs/registry.py)."""

from __future__ import annotations

from service.consolidation.operations import CONSOLIDATE
from service.consolidation.service import run_batch
from service.jobs.declare import Job

CONSOLIDATION = Job(
    CONSOLIDATE,
    run_batch,
    needs=frozenset({"read", "write"}),
    options=frozenset({"subject"}),
)
"""Reads through the job principal's read grants, writes summaries only where it may write;
retracting a summary left without inputs takes `delete` there too (else `retract_refused`)."""

__all__ = ["CONSOLIDATION"]
