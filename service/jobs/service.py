"""Queue, list and read job runs (REST, MCP and the CLI call these; services never commit).

Queueing a run makes sure the tenant's job principal exists and takes a snapshot of the spaces
it holds each action on: the grants the run may ever use (each batch intersects them with the
grants held then).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from service.calls import Facts
from service.db.base import uuid7
from service.db.models import JobRun, Space
from service.jobs.declare import Job
from service.jobs.principals import ensure_job_principal, snapshot
from service.jobs.problems import RunNotFound, UnknownJob
from service.jobs.schemas import RunCreate, RunError, RunOut, RunPage
from service.memory.problems import SpaceNotFound
from service.memory.service import decode_cursor, encode_cursor
from service.problems import InvalidRequest

PAGE_SIZE = 50


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

    async def enqueue(self, job: Job, request: RunCreate, enqueued_by: uuid.UUID | None) -> RunOut:
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
        principal_id = await ensure_job_principal(self._session, self._tenant_id)
        granted = await snapshot(self._session, self._tenant_id, principal_id)
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
            enqueued_by=enqueued_by,
            principal_id=principal_id,
            granted=granted.as_json(),
        )
        self._session.add(run)
        await self._session.flush()
        await self._session.refresh(run)
        self._facts.add_targets([run.id])
        return run_out(run)

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


def run_out(run: JobRun) -> RunOut:
    error = None
    if run.error_slug is not None:
        error = RunError(slug=run.error_slug, detail=run.error_detail or "")
    return RunOut(
        id=run.id,
        job=run.job,
        status=run.status,  # type: ignore[arg-type]
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
