"""The job runner: a run, batch by batch, each batch one `Call` committed with the run's cursor.

One step of a run is one call of the job's operation (method `JOB`), as the tenant's job
principal with its grants at enqueue ∩ its grants now:

1. the call's transaction names the job principal (row-level security), reads the run, and takes
   `pg_try_advisory_xact_lock` on (job, tenant). Held until the transaction ends, the lock is
   why two runners — two processes, two replicas — never run the same batch: the second does
   not wait on it (it would then run from a cursor read before the first committed), it backs
   off and tries again, and after the lock it reads the run row afresh (`FOR UPDATE`);
2. the job principal must hold every action of the job's `needs` (on the run's space, if it
   names one); otherwise the run ends `refused`, audited as a denial, saying which grant;
3. the batch runs from the run's cursor, at most `batch_size` items;
4. the run's new cursor, summed counts and heartbeat are written in the same transaction, and
   the call finishes: its audit row (action = the job's operation, counts in the row) commits
   with everything the batch did. A batch that fails is rolled back whole and audited as a
   failure: the run stays where its last committed batch left it.

A run whose process died (or whose task was cancelled) keeps its last committed cursor; its
heartbeat goes stale, and after `lease_seconds` `pick_up` (any runner: the scheduler's, the
CLI's) takes it up again from there. A live run's heartbeat is fresh, so it is not taken up;
should it be anyway, the lock keeps the batches apart.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum

import structlog
from sqlalchemy import func, select, text, update

from service.auth.principal import Principal
from service.calls import Call
from service.db.models import JobRun
from service.db.tenancy import name_tenant
from service.jobs.declare import Batch, Job, RunScope
from service.jobs.principals import (
    job_principal,
    job_token,
    snapshot_of,
    tenant_settings,
)
from service.jobs.problems import JobGrantsMissing, UnknownJob
from service.policy.visible import Action, granted_space_ids
from service.problems import Problem
from service.runtime import Runtime
from service.tenants.settings import DEFAULT as _NO_SETTINGS

_log = structlog.get_logger("memgate.jobs")

MAX_FAILURES = 3
"""Failed batches in a row after which a run is marked `failed` (a bug, not a blip)."""
MAX_DETAIL_CHARS = 500
BUSY_PAUSE_SECONDS = 0.05
_LOCK = text("SELECT pg_try_advisory_xact_lock(hashtextextended(:key, 0))")
_DUE = text("SELECT tenant_id, id FROM memgate_job_runs_due(:lease)")


class Step(StrEnum):
    DONE = "done"
    """The run has ended (finished, failed or refused): nothing more to do."""
    MORE = "more"
    """A batch committed; the run goes on."""
    BUSY = "busy"
    """Another runner holds the (job, tenant) lock right now."""


@dataclass(frozen=True)
class RunState:
    """What a step read of its run (plain values: the row's ORM object expires on rollback)."""

    tenant_id: uuid.UUID
    id: uuid.UUID
    job: str
    status: str
    space_id: uuid.UUID | None
    dry_run: bool
    options: Mapping[str, str]
    cursor: str | None
    counts: Mapping[str, object]
    batches: int
    failures: int
    granted: Mapping[str, object]

    @classmethod
    def of(cls, row: JobRun) -> RunState:
        return cls(
            row.tenant_id,
            row.id,
            row.job,
            row.status,
            row.space_id,
            row.dry_run,
            {str(k): str(v) for k, v in row.options.items()},
            row.cursor,
            dict(row.counts),
            row.batches,
            row.failures,
            dict(row.granted),
        )

    @property
    def ended(self) -> bool:
        return self.status not in ("queued", "running")


@dataclass(frozen=True)
class Progress:
    run_id: uuid.UUID
    job: str
    status: str
    batches: int
    counts: Mapping[str, int]


def lock_key(job: str, tenant_id: uuid.UUID) -> str:
    return f"memgate.job:{job}:{tenant_id}"


@dataclass
class Runner:
    runtime: Runtime
    jobs: Mapping[str, Job]
    batch_size: int = 100
    lease_seconds: float = 300.0
    on_progress: Callable[[Progress], None] | None = None

    async def run(self, tenant_id: uuid.UUID, run_id: uuid.UUID) -> None:
        """Run `run_id` until it ends. Safe to call from several runners at once, and again
        after a crash: each batch is taken by one runner, from the last committed cursor."""
        while True:
            step = await self.step(tenant_id, run_id)
            if step is Step.DONE:
                return
            if step is Step.BUSY:
                await asyncio.sleep(BUSY_PAUSE_SECONDS)

    async def pick_up(self) -> int:
        """Take up the runs that are due (queued, or running with a stale heartbeat: their
        runner died) and run them in turns, one batch of each per pass, until they end: one
        tenant's many or long runs hold back another tenant's by one batch each, not by whole
        runs (the due list also puts every tenant's oldest run first). A run whose batch
        raises is audited and logged, stays at its cursor for the next poll, and the others go
        on. Returns how many runs this call took to their end."""
        turns: dict[tuple[uuid.UUID, uuid.UUID], None] = {}  # an ordered set
        handled: set[tuple[uuid.UUID, uuid.UUID]] = set()
        ended = 0
        while True:
            for key in await self._due():
                if key not in handled:
                    turns.setdefault(key, None)
            if not turns:
                return ended
            progressed = False
            for key in list(turns):
                step = await self._contained_step(*key)
                if step is Step.BUSY:
                    continue
                progressed = True
                if step is not Step.MORE:  # ended, or failed this time: not again in this call
                    del turns[key]
                    handled.add(key)
                    if step is Step.DONE:
                        ended += 1
            if not progressed:
                await asyncio.sleep(BUSY_PAUSE_SECONDS)

    async def _due(self) -> list[tuple[uuid.UUID, uuid.UUID]]:
        async with self.runtime.sessionmaker() as session:
            rows = (await session.execute(_DUE, {"lease": self.lease_seconds})).all()
        return [(row[0], row[1]) for row in rows]

    async def _contained_step(self, tenant_id: uuid.UUID, run_id: uuid.UUID) -> Step | None:
        """One step, or None when it raised: the failure is the run's alone (its batch was
        audited and counted against it by `_batch`), not the worker's."""
        try:
            return await self.step(tenant_id, run_id)
        except Exception as exc:  # the type only: a message can quote content or SQL
            _log.error(
                "job_run_left",
                run_id=str(run_id),
                tenant=str(tenant_id),
                error_type=type(exc).__name__,
            )
            return None

    async def step(self, tenant_id: uuid.UUID, run_id: uuid.UUID) -> Step:
        """One batch of the run, in one call (or nothing, when the run has ended or another
        runner holds its lock)."""
        naming = job_principal(tenant_id, run_id, snapshot_of({}), _NO_SETTINGS)
        call = Call(self.runtime, "jobs.batch", "JOB", "/jobs", caller=naming)
        # Nothing is audited unless a batch (or a refusal) happens: a step that finds the run
        # ended or locked did no work in the tenant.
        call.exempt = True
        try:
            return await self._step(call, tenant_id, run_id)
        finally:
            await call.close()

    async def _step(self, call: Call, tenant_id: uuid.UUID, run_id: uuid.UUID) -> Step:
        first = await self._read(call, tenant_id, run_id, lock=False)
        if first is None or first.ended:
            await call.finish(200)
            return Step.DONE
        job = self.jobs.get(first.job)
        if job is None:  # a run of a job this version no longer has: audited, then failed
            found = await tenant_settings(call.db, tenant_id) or _NO_SETTINGS
            acting = job_principal(tenant_id, run_id, snapshot_of(first.granted), found)
            call.caller, call.token = acting, job_token(acting, self.runtime.embedded_keys)
            call.action, call.route, call.exempt = first.job, f"/jobs/{first.job}/runs", False
            call.path_ids = [run_id]
            await call.finish(UnknownJob.status, UnknownJob.slug)
            await self._fail(tenant_id, run_id, UnknownJob.slug, f"No job '{first.job}' here.")
            return Step.DONE
        if not await call.db.scalar(_LOCK, {"key": lock_key(job.name, tenant_id)}):
            await call.finish(200)
            return Step.BUSY
        # After the lock, read the run again: another runner may have moved it meanwhile.
        run = await self._read(call, tenant_id, run_id, lock=True)
        if run is None or run.ended:
            await call.finish(200)
            return Step.DONE
        settings = await tenant_settings(call.db, tenant_id)
        if settings is None:
            # A disabled tenant's runs wait where they are: once it is enabled again, its
            # stale runs are due and go on from their cursor.
            await call.finish(200)
            return Step.DONE
        principal = job_principal(tenant_id, run_id, snapshot_of(run.granted), settings)
        call.caller, call.token = principal, job_token(principal, self.runtime.embedded_keys)
        call.action, call.route, call.exempt = job.name, f"/jobs/{job.name}/runs", False
        call.path_ids = [run_id]
        scope = RunScope(tenant_id, run.space_id, run.dry_run, dict(run.options))
        return await self._batch(call, job, run, principal, scope)

    async def _read(
        self, call: Call, tenant_id: uuid.UUID, run_id: uuid.UUID, *, lock: bool
    ) -> RunState | None:
        statement = select(JobRun).where(JobRun.tenant_id == tenant_id, JobRun.id == run_id)
        if lock:
            statement = statement.with_for_update().execution_options(populate_existing=True)
        row = await call.db.scalar(statement)
        return None if row is None else RunState.of(row)

    async def _batch(
        self, call: Call, job: Job, run: RunState, principal: Principal, scope: RunScope
    ) -> Step:
        try:
            await self._check_needs(call, job, principal, scope)
            done = await job.run_batch(
                Batch(call, principal, self.runtime, scope, run.cursor, self.batch_size)
            )
        except JobGrantsMissing as refused:
            await call.finish(refused.status, refused.slug)
            await self._end(run, "refused", refused.slug, refused.detail)
            return Step.DONE
        except Problem as problem:
            await call.finish(problem.status, problem.slug)
            await self._end(run, "failed", problem.slug, problem.detail)
            return Step.DONE
        except Exception as exc:
            await call.finish(500, "internal-error")
            await self._failed_batch(run, type(exc).__name__)
            # The type only: a message can quote content or SQL.
            _log.error(
                "job_batch_failed", job=job.name, run_id=str(run.id), error_type=type(exc).__name__
            )
            raise
        counts = _summed(run.counts, done.counts)
        finished = done.cursor is None
        await call.db.execute(
            update(JobRun)
            .where(JobRun.tenant_id == run.tenant_id, JobRun.id == run.id)
            .values(
                status="finished" if finished else "running",
                cursor=done.cursor,
                counts=counts,
                batches=JobRun.batches + 1,
                failures=0,
                started_at=func.coalesce(JobRun.started_at, func.now()),
                heartbeat_at=func.now(),
                finished_at=func.now() if finished else None,
            )
        )
        # The row's count: the items the batch noted as targets, else the sum of its counts;
        # every count by name is in the reason.
        handled = len(call.facts.targets)
        call.facts.count(handled if handled else sum(done.counts.values()))
        call.facts.reason = _counts_reason(done.counts)
        unrecorded = await call.finish(200)
        if unrecorded is not None:
            # Nothing of the batch is known to be kept: the next step repeats it safely.
            raise unrecorded
        _log.info(
            "job_batch", job=job.name, run_id=str(run.id), tenant=str(run.tenant_id), counts=counts
        )
        if self.on_progress is not None:
            status = "finished" if finished else "running"
            self.on_progress(Progress(run.id, job.name, status, run.batches + 1, counts))
        return Step.DONE if finished else Step.MORE

    async def _check_needs(
        self, call: Call, job: Job, principal: Principal, scope: RunScope
    ) -> None:
        for action in sorted(job.needs):
            spaces = await granted_space_ids(call.db, principal, Action(action))
            if spaces and (scope.space_id is None or scope.space_id in spaces):
                continue
            where = f"on space {scope.space_id}" if scope.space_id else "on any space"
            raise JobGrantsMissing(
                f"The job '{job.name}' needs '{action}' {where}; its principal "
                f"service:{principal.principal_id} holds none there (needed both when the run "
                "was queued, within what its starter could read, and now). Grant it "
                f"(PUT /v1/spaces/{{space_id}}/grants/"
                f"{action}/service:{principal.principal_id}) and start a new run.",
            )

    async def _end(self, run: RunState, status: str, slug: str, detail: str) -> None:
        await self._write(
            run.tenant_id,
            run.id,
            status=status,
            error_slug=slug,
            error_detail=detail[:MAX_DETAIL_CHARS],
            finished_at=func.now(),
            heartbeat_at=func.now(),
        )

    async def _fail(self, tenant_id: uuid.UUID, run_id: uuid.UUID, slug: str, detail: str) -> None:
        await self._write(
            tenant_id,
            run_id,
            status="failed",
            error_slug=slug,
            error_detail=detail,
            finished_at=func.now(),
        )

    async def _failed_batch(self, run: RunState, error_type: str) -> None:
        """A batch raised: the run stays at its cursor (resumed later), noting the error (its
        type only: a message can quote content); after `MAX_FAILURES` in a row it fails."""
        failures = run.failures + 1
        values: dict[str, object] = {
            "failures": failures,
            "error_slug": "internal-error",
            "error_detail": f"A batch failed ({error_type}); the run resumes from its cursor.",
        }
        if failures >= MAX_FAILURES:
            values |= {"status": "failed", "finished_at": func.now()}
        await self._write(run.tenant_id, run.id, **values)

    async def _write(self, tenant_id: uuid.UUID, run_id: uuid.UUID, **values: object) -> None:
        async with self.runtime.sessionmaker.begin() as session:
            await name_tenant(session, tenant_id)
            await session.execute(
                update(JobRun)
                .where(JobRun.tenant_id == tenant_id, JobRun.id == run_id)
                .values(**values)
            )


def _summed(before: Mapping[str, object], batch: Mapping[str, int]) -> dict[str, int]:
    counts = {key: int(value) for key, value in before.items() if isinstance(value, int)}
    for key, value in batch.items():
        counts[key] = counts.get(key, 0) + int(value)
    return counts


def _counts_reason(counts: Mapping[str, int]) -> str:
    """The batch's counts in its audit row's reason (numbers and names only, no content)."""
    return "ok " + ",".join(f"{key}={value}" for key, value in sorted(counts.items()))
