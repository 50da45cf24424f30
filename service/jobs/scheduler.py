"""The in-process job worker of `serve` (the embedded default): runs queued and abandoned runs,
and queues the scheduled ones.

Every `MEMGATE_JOBS_POLL_SECONDS` it takes up the runs that are due (queued through the API,
the MCP tool or the schedule; or abandoned by a runner that died) and runs them to their end.
Every interval of `MEMGATE_JOBS_SCHEDULE` it queues a run of that job in each enabled tenant
that has none queued or running. Replicas may all run it: the (job, tenant) lock keeps their
batches apart, and a run already queued is not queued twice. Off with `MEMGATE_JOBS_POLL_SECONDS=0`
(a Kubernetes CronJob then runs `memgate jobs run NAME`).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping

import structlog
from sqlalchemy import select, text

from service.db.models import JobRun
from service.db.tenancy import name_tenant
from service.jobs.declare import Job
from service.jobs.runner import Runner
from service.jobs.schemas import RunCreate
from service.jobs.service import JobService
from service.runtime import Runtime

_log = structlog.get_logger("memgate.jobs")
_TENANTS = text("SELECT memgate_job_tenants()")


async def enabled_tenants(runtime: Runtime) -> list[uuid.UUID]:
    async with runtime.sessionmaker() as session:
        return list((await session.scalars(_TENANTS)).all())


async def queue_everywhere(runtime: Runtime, job: Job) -> int:
    """A run of `job` in every enabled tenant without one queued or running; how many."""
    from service.calls import Facts

    queued = 0
    for tenant_id in await enabled_tenants(runtime):
        async with runtime.sessionmaker.begin() as session:
            await name_tenant(session, tenant_id)
            pending = await session.scalar(
                select(JobRun.id).where(
                    JobRun.tenant_id == tenant_id,
                    JobRun.job == job.name,
                    JobRun.status.in_(("queued", "running")),
                )
            )
            if pending is None:
                await JobService(session, tenant_id, Facts()).enqueue(job, RunCreate(), None)
                queued += 1
    return queued


def runner_of(runtime: Runtime, jobs: Mapping[str, Job]) -> Runner:
    settings = runtime.settings.jobs
    return Runner(
        runtime, jobs, batch_size=settings.batch_size, lease_seconds=settings.lease_seconds
    )


async def work(runtime: Runtime, jobs: Mapping[str, Job]) -> None:
    """The worker loop (cancelled when the app stops; a batch cut short is rolled back and
    taken up again later from the run's cursor)."""
    settings = runtime.settings.jobs
    runner = runner_of(runtime, jobs)
    last: dict[str, float] = {}
    while True:
        await asyncio.sleep(settings.poll_seconds)
        now = time.monotonic()
        for name, every in settings.schedule:
            job = jobs.get(name)
            if job is None or now - last.get(name, float("-inf")) < every:
                continue
            last[name] = now
            await _logged(name, queue_everywhere(runtime, job))
        await _logged("pick_up", runner.pick_up())


async def _logged(what: str, work: object) -> None:
    try:
        await work  # type: ignore[misc]
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # the worker goes on; the type only (a message can quote SQL)
        _log.error("job_worker_failed", step=what, error_type=type(exc).__name__)
