"""`memgate jobs run NAME [--tenant T] [--space S] [--dry-run]`: run a job now, from a shell or a
Kubernetes CronJob.

It talks to the database, not the HTTP server (like `memgate tenants`), so it works against a
running `serve`'s embedded cluster, which it leaves running, as well as against a managed
PostgreSQL. A tenant job is queued in each tenant asked for (`--tenant`, else every enabled
tenant), as a `jobs.start` call of the tenant's job principal (audited in the tenant's chain),
then run here to its end batch by batch; an identical run (same job, space, dry run and options)
already queued or running there is joined instead (the (job, tenant) lock keeps two runners'
batches apart). A run whose batch fails stays at its cursor (audited, shown in the output)
and the other tenants' runs go on; the exit code is 1 unless every run finished. Progress goes to
stderr, one line per batch; the runs as the API shows them go to stdout as JSON. A platform job
(`audit.checkpoint`, `keys.rotate`) runs once, audited in the platform chain.
"""

from __future__ import annotations

import sys
import uuid
from typing import Any, TextIO

import msgspec

from service.jobs.platform import PLATFORM_JOBS, OwnerLoginNeeded, run_platform_job
from service.jobs.registry import JOBS
from service.jobs.runner import Progress
from service.jobs.scheduler import enabled_tenants, queue_as_operator, runner_of
from service.jobs.schemas import RunCreate
from service.jobs.service import JobService
from service.problems import Problem
from service.runtime import Runtime


class JobRefused(Exception):
    """What the operator asked for cannot run (unknown job or tenant); nothing was queued."""


def _progress(out: TextIO) -> Any:
    def report(progress: Progress) -> None:
        counts = " ".join(f"{k}={v}" for k, v in sorted(progress.counts.items()))
        print(
            f"{progress.job} run {progress.run_id}: batch {progress.batches} {progress.status} "
            f"({counts})",
            file=out,
            flush=True,
        )

    return report


async def run(
    runtime: Runtime,
    name: str,
    tenant_id: uuid.UUID | None,
    space_id: uuid.UUID | None,
    dry_run: bool,
    owner_url: str | None,
    progress: TextIO = sys.stderr,
) -> dict[str, Any]:
    """Run `name`; the runs (or the platform job's counts) as JSON-ready values."""
    platform = PLATFORM_JOBS.get(name)
    if platform is not None:
        try:
            counts = await run_platform_job(runtime, platform, owner_url, via="CLI")
        except OwnerLoginNeeded as exc:
            raise JobRefused(str(exc)) from None
        return {"job": name, "counts": counts}
    job = JOBS.get(name)
    if job is None:
        known = ", ".join(sorted([*JOBS, *PLATFORM_JOBS]))
        raise JobRefused(f"there is no job '{name}'; the jobs are: {known}")
    tenants = await enabled_tenants(runtime)
    if tenant_id is not None:
        if tenant_id not in tenants:
            raise JobRefused(f"no enabled tenant {tenant_id}")
        tenants = [tenant_id]
    runner = runner_of(runtime, JOBS)
    runner.on_progress = _progress(progress)
    runs: list[Any] = []
    for tenant in tenants:
        request = RunCreate(space_id=space_id, dry_run=dry_run)
        run_id = await queue_as_operator(runtime, tenant, job, request, "CLI")
        assert run_id is not None
        try:
            await runner.run(tenant, run_id)
        except Exception as exc:  # the run's failure, not the other tenants': go on with them
            # Its batch was audited and counted against it by the runner; the run (status,
            # error) is in the output and the exit code says not all finished.
            print(f"{name} run {run_id}: batch failed ({type(exc).__name__})", file=progress)
        runs.append(
            {"tenant_id": str(tenant), **msgspec.to_builtins(await _read(runtime, tenant, run_id))}
        )
    return {"job": name, "runs": runs}


async def _read(runtime: Runtime, tenant_id: uuid.UUID, run_id: uuid.UUID) -> Any:
    from service.calls import Facts
    from service.db.tenancy import name_tenant

    async with runtime.sessionmaker() as session:
        await name_tenant(session, tenant_id)
        return await JobService(session, tenant_id, Facts()).get(run_id)


__all__ = ["JobRefused", "Problem", "run"]
