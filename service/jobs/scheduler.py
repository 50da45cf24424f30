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
from collections.abc import Awaitable, Mapping

import structlog
from sqlalchemy import text

from service.calls import Call
from service.jobs.declare import Job
from service.jobs.operations import START
from service.jobs.platform import PLATFORM_JOBS, run_platform_job
from service.jobs.principals import job_principal, job_token, snapshot_of
from service.jobs.runner import Runner
from service.jobs.schemas import RunCreate
from service.jobs.service import JobService
from service.problems import Problem
from service.runtime import Runtime
from service.tenants.settings import DEFAULT as DEFAULT_SETTINGS

_log = structlog.get_logger("memgate.jobs")
_TENANTS = text("SELECT memgate_job_tenants()")


async def enabled_tenants(runtime: Runtime) -> list[uuid.UUID]:
    async with runtime.sessionmaker() as session:
        return list((await session.scalars(_TENANTS)).all())


async def queue_as_operator(
    runtime: Runtime, tenant_id: uuid.UUID, job: Job, request: RunCreate, via: str
) -> uuid.UUID | None:
    """Queue a run of `job` in `tenant_id` for the operator (`via`: `CLI`, `SCHEDULE`), unless
    an identical one is queued or running already (the CLI joins it; the schedule gets None).
    A call of `jobs.start` like the API's, made by the tenant's job principal (nobody else
    acts), audited in the tenant's chain."""
    caller = job_principal(tenant_id, uuid.UUID(int=0), snapshot_of({}), DEFAULT_SETTINGS)
    call = Call(runtime, START.name, via, f"/jobs/{job.name}/runs", caller=caller)
    call.token = job_token(caller, runtime.embedded_keys)
    try:
        # An identical run (same job, space, dry run and options: a whole-tenant run never
        # joins a one-subject run) already queued or running is joined instead.
        queued = await JobService(call.db, tenant_id, call.facts).enqueue(job, request, None)
        if queued.joined:
            call.exempt = True  # nothing done: no row per tenant per interval
            await call.finish(200)
            return queued.run.id if via == "CLI" else None
        unrecorded = await call.finish(START.success)
        if unrecorded is not None:
            raise unrecorded
        return queued.run.id
    except Problem as problem:
        if not call.finished:
            await call.finish(problem.status, problem.slug)
        raise
    finally:
        await call.close()


async def queue_everywhere(runtime: Runtime, job: Job) -> int:
    """A run of `job` in every enabled tenant without one queued or running; how many."""
    queued = 0
    for tenant_id in await enabled_tenants(runtime):
        if await queue_as_operator(runtime, tenant_id, job, RunCreate(), "SCHEDULE"):
            queued += 1
    return queued


def runner_of(runtime: Runtime, jobs: Mapping[str, Job]) -> Runner:
    settings = runtime.settings.jobs
    return Runner(
        runtime, jobs, batch_size=settings.batch_size, lease_seconds=settings.lease_seconds
    )


async def work(runtime: Runtime, jobs: Mapping[str, Job]) -> None:
    """The worker loop (cancelled when the app stops; a batch cut short is rolled back and
    taken up again later from the run's cursor). A scheduled platform job runs here directly
    (one audited step); `keys.rotate` needs the owner's login, which `serve`'s app does not
    hold, so it fails audited and logged: schedule it as a CronJob instead."""
    settings = runtime.settings.jobs
    runner = runner_of(runtime, jobs)
    unknown = [
        name for name, _ in settings.schedule if name not in jobs and name not in PLATFORM_JOBS
    ]
    if unknown:
        _log.error("job_schedule_unknown", jobs=unknown, known=sorted([*jobs, *PLATFORM_JOBS]))
    last: dict[str, float] = {}
    while True:
        await asyncio.sleep(settings.poll_seconds)
        now = time.monotonic()
        for name, every in settings.schedule:
            if now - last.get(name, float("-inf")) < every:
                continue
            last[name] = now
            job, platform = jobs.get(name), PLATFORM_JOBS.get(name)
            if job is not None:
                await _logged(name, queue_everywhere(runtime, job))
            elif platform is not None:
                await _logged(name, run_platform_job(runtime, platform, None, via="SCHEDULE"))
        await _logged("pick_up", runner.pick_up())


async def _logged(what: str, work: Awaitable[object]) -> None:
    try:
        await work
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # the worker goes on; the type only (a message can quote SQL)
        _log.error("job_worker_failed", step=what, error_type=type(exc).__name__)
