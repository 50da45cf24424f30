"""Every job the runner knows, by name (`memory.sweep_expired`).

Each feature declares its jobs in a module of its own (a `Job`: operation, batch function, needs,
options) that is imported here, so the registry is the one list the API, the MCP tool, the CLI
and the scheduler share. `memory.sweep_expired` lives in service/memory/sweep.py.
"""

from __future__ import annotations

from service.consolidation.jobs import CONSOLIDATION
from service.embeddings.jobs import REEMBED_JOB
from service.jobs.declare import Job
from service.memory.jobs import AGE_UNUSED_JOB
from service.memory.sweep import SWEEP_EXPIRED

JOBS: dict[str, Job] = {
    job.name: job for job in (SWEEP_EXPIRED, CONSOLIDATION, AGE_UNUSED_JOB, REEMBED_JOB)
}
"""Tenant jobs: run batch by batch as the tenant's job principal."""


def known_jobs() -> str:
    """The job names, for a problem that tells a caller what it could have asked for."""
    return ", ".join(sorted(JOBS))
