"""The memory feature's jobs (registered in service/jobs/registry.py by the runner)."""

from __future__ import annotations

from service.jobs.declare import Job
from service.memory.aging import age_unused_batch
from service.memory.operations import AGE_UNUSED

AGE_UNUSED_JOB = Job(AGE_UNUSED, age_unused_batch, needs=frozenset({"read", "write"}))
"""Expires memories unused for their space's `max_unused_days` (service/memory/aging.py)."""

__all__ = ["AGE_UNUSED_JOB"]
