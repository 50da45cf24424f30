"""Queue, list and read job runs (REST, MCP and the CLI call these; services never commit).

Queueing a run makes sure the tenant's job principal exists and takes a snapshot of the spaces
it holds each action on: the grants the run may ever use (each batch intersects them with the
grants held then). A run started by a caller (REST, MCP) is also kept inside the spaces that
caller may read: neither its counts nor its writes reach what the caller cannot see.

Queueing is serialised per tenant (a short transaction lock): a run identical to one already
queued or running (job, space, dry run, options and the grants it would act with) joins that
run, and a caller's run beyond the tenant's cap of pending runs is refused.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast, get_args

from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncSession

from service.auth.principal import GrantSnapshot, Principal
from service.calls import Facts
from service.db.base import uuid7
from service.db.models import JobRun, Space
from service.jobs.declare import Job
from service.jobs.principals import ensure_job_principal, snapshot
from service.jobs.problems import JobQueueFull, RunNotFound, UnknownJob
from service.jobs.schemas import RunCreate, RunError, RunOut, RunPage, RunStatus
from service.memory.problems import SpaceNotFound
from service.memory.service import decode_cursor, encode_cursor
from service.policy.visible import Action, granted_space_ids
from service.problems import InvalidRequest

PAGE_SIZE = 50
PENDING = ("queued", "running")
QUEUE_FULL_RETRY_SECONDS = 30
"""`Retry-After` of a refused run: about the time a few batches of the pending runs take."""
_QUEUE_LOCK = text("SELECT pg_advisory_xact_lock(hashtextextended(:key, 0))")


@dataclass(frozen=True)
class Queued:
    run: RunOut
    joined: bool
    """True: an identical run was queued or running already, and `run` is that run."""


def job_named(jobs: Mapping[str, Job], name: str) -> Job:
    job = jobs.get(name)
    if job is None:
        raise UnknownJob(
            f"There is no job '{name[:100]}'. The jobs are: {', '.join(sorted(jobs))}.",
        )
    return job


class JobService:
    def __init__(self, session: AsyncSession, tenant_id: uuid.UUID, facts: Facts) -> None:
        self._session = session
        self._tenant_id = tenant_id
        self._facts = facts

    async def enqueue(
        self, job: Job, request: RunCreate, caller: Principal | None, *, cap: int | None = None
    ) -> Queued:
        """Queue a run of `job` (or join the identical one pending). `caller`: who asked (None:
        the operator's CLI or schedule); `cap`: the most queued and running runs the tenant
        may have when a caller asks for one more (None: no cap)."""
        unknown = sorted(set(request.options) - job.options)
        if unknown:
            allowed = ", ".join(sorted(job.options)) or "none"
            raise InvalidRequest(
                f"The job '{job.name}' takes no option {', '.join(unknown)}; its options: "
                f"{allowed}. Nothing was queued.",
                errors=[{"field": f"options.{name}", "message": "unknown"} for name in unknown],
            )
        if request.space_id is not None:
            await self._space_exists(request.space_id)
        # Two callers (two replicas' schedules, two CronJob pods, a flood of API calls) queueing
        # at once in one tenant: the second waits here for the first's commit, then finds its
        # run (and joins it) or counts it against the cap.
        await self._session.execute(_QUEUE_LOCK, {"key": f"memgate.job-queue:{self._tenant_id}"})
        principal_id = await ensure_job_principal(self._session, self._tenant_id)
        granted = await snapshot(self._session, self._tenant_id, principal_id)
        if caller is not None:
            granted = await self._within_reads_of(caller, granted)
        pending = await self._identical(job, request, granted)
        if pending is not None:
            return Queued(run_out(pending), joined=True)
        if cap is not None:
            await self._check_cap(cap)
        run = JobRun(
            tenant_id=self._tenant_id,
            id=uuid7(),
            job=job.name,
            space_id=request.space_id,
            dry_run=request.dry_run,
            options=dict(request.options),
            status="queued",
            counts={},
            batches=0,
            failures=0,
            enqueued_by=None if caller is None else caller.principal_id,
            principal_id=principal_id,
            granted=granted.as_json(),
        )
        self._session.add(run)
        await self._session.flush()
        await self._session.refresh(run)
        self._facts.add_targets([run.id])
        return Queued(run_out(run), joined=False)

    async def _within_reads_of(self, caller: Principal, granted: GrantSnapshot) -> GrantSnapshot:
        """The job principal's grants, each limited to the spaces `caller` may read (its own
        grants, or both a delegated call's user and agent hold): a caller cannot make a job
        count, summarise or change what it could not read itself."""
        readable = set(await granted_space_ids(self._session, caller, Action.READ))
        return GrantSnapshot.of(
            {action.value: granted.spaces(action.value) & readable for action in Action}
        )

    async def _identical(
        self, job: Job, request: RunCreate, granted: GrantSnapshot
    ) -> JobRun | None:
        same_space = (
            JobRun.space_id.is_(None)
            if request.space_id is None
            else JobRun.space_id == request.space_id
        )
        found: JobRun | None = await self._session.scalar(
            select(JobRun)
            .where(
                JobRun.tenant_id == self._tenant_id,
                JobRun.job == job.name,
                JobRun.status.in_(PENDING),
                same_space,
                JobRun.dry_run.is_(request.dry_run),
                JobRun.options == dict(request.options),
                JobRun.granted == granted.as_json(),
            )
            .order_by(JobRun.id)
            .limit(1)
        )
        return found

    async def _check_cap(self, cap: int) -> None:
        pending = await self._session.scalar(
            select(func.count())
            .select_from(JobRun)
            .where(JobRun.tenant_id == self._tenant_id, JobRun.status.in_(PENDING))
        )
        if (pending or 0) >= cap:
            raise JobQueueFull(
                f"Your tenant has {pending} job runs queued or running, the most it may have "
                f"(MEMGATE_JOBS_MAX_PENDING = {cap}); nothing was queued. Retry after "
                f"{QUEUE_FULL_RETRY_SECONDS} s, or poll GET /v1/jobs/runs?status=queued until "
                "some have finished. An identical run (same job, space, dry_run and options) "
                "is joined, not queued again, so repeating a request costs nothing.",
                retry_after=QUEUE_FULL_RETRY_SECONDS,
            )

    async def _space_exists(self, space_id: uuid.UUID) -> None:
        found = await self._session.scalar(
            select(Space.id).where(Space.tenant_id == self._tenant_id, Space.id == space_id)
        )
        if found is None:
            raise SpaceNotFound(f"No space {space_id} in your tenant; nothing was queued.")

    async def get(self, run_id: uuid.UUID) -> RunOut:
        run = await self._session.scalar(
            select(JobRun).where(JobRun.tenant_id == self._tenant_id, JobRun.id == run_id)
        )
        if run is None:
            raise RunNotFound(f"No job run {run_id} in your tenant.")
        self._facts.add_targets([run.id])
        return run_out(run)

    async def list_page(self, cursor: str | None, status: str | None = None) -> RunPage:
        statement = select(JobRun).where(JobRun.tenant_id == self._tenant_id)
        if status is not None:
            statement = statement.where(JobRun.status == status)
        if cursor:
            statement = statement.where(JobRun.id < decode_cursor(cursor))
        rows = list(
            await self._session.scalars(statement.order_by(JobRun.id.desc()).limit(PAGE_SIZE + 1))
        )
        page = rows[:PAGE_SIZE]
        self._facts.add_targets(row.id for row in page)
        self._facts.count(len(page))
        more = len(rows) > PAGE_SIZE
        return RunPage(
            items=[run_out(row) for row in page],
            next_cursor=encode_cursor(page[-1].id) if more else None,
        )


RUN_STATUSES: tuple[str, ...] = get_args(RunStatus)


def _status(stored: str) -> RunStatus:
    """The stored status as the answer's type (the table's CHECK holds the same five)."""
    if stored not in RUN_STATUSES:
        raise ValueError(f"job_runs.status {stored!r} is none of {RUN_STATUSES}")
    return cast(RunStatus, stored)


def run_out(run: JobRun) -> RunOut:
    error = None
    if run.error_slug is not None:
        error = RunError(slug=run.error_slug, detail=run.error_detail or "")
    return RunOut(
        id=run.id,
        job=run.job,
        status=_status(run.status),
        space_id=run.space_id,
        dry_run=run.dry_run,
        options={str(k): str(v) for k, v in run.options.items()},
        counts={str(k): int(v) for k, v in run.counts.items()},
        batches=run.batches,
        principal_id=run.principal_id,
        enqueued_by=run.enqueued_by,
        enqueued_at=run.enqueued_at,
        started_at=run.started_at,
        finished_at=run.finished_at,
        heartbeat_at=run.heartbeat_at,
        error=error,
    )
