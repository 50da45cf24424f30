"""The consolidation job, for the runner's registry (service/jobs/registry.py)."""

from __future__ import annotations

from service.consolidation.operations import CONSOLIDATE
from service.consolidation.service import run_batch
from service.jobs.declare import Job

CONSOLIDATION = Job(
    CONSOLIDATE,
    run_batch,
    needs=frozenset({"read", "write", "delete"}),
    options=frozenset({"subject"}),
)
"""Reads through the job principal's read grants, writes summaries only where it may write and
delete: a summary built from an input that is deleted later must be retracted (promise 7), and
write never implies delete."""

__all__ = ["CONSOLIDATION"]
