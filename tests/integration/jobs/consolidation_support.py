"""Running a job's batches in a test the way the runner does: one call per batch as the job
principal, committed with its audit row, until the cursor says the run is finished.

Until the runner is on this branch, the job principal is a service principal with an admin
client holding `run:jobs`, and each batch's call is authenticated from a real token of that
client (`open_call`), so the audit row, row-level security and grants are all the real ones."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from service.calls import open_call
from service.jobs.declare import Batch, BatchDone, Job, RunScope
from service.runtime import Runtime
from tests.fixtures.api import Agent, Api
from tests.integration.memory.support import as_owner

BatchFunction = Callable[[Batch], Awaitable[BatchDone]]


@dataclass(frozen=True)
class JobPrincipal:
    """A service principal of the tenant (made through the API: it gets its personal space and
    nothing else until policy grants it more) and a token of its `run:jobs` client."""

    tenant_id: uuid.UUID
    principal_id: uuid.UUID
    token: str


async def job_principal(api: Api, name: str = "consolidator") -> JobPrincipal:
    created = await api.new_principal(name, kind="service")
    client = await api.new_client(created["id"], ["run:jobs"], kind="admin")
    token = await api.access_token(client["client"]["client_id"], client["client_secret"])
    return JobPrincipal(uuid.UUID(api.tenant_id), uuid.UUID(created["id"]), token)


async def grant(api: Api, space_id: str, subject: str, *actions: str) -> None:
    for action in actions:
        granted = await api.http.put(
            f"/v1/spaces/{space_id}/grants/{action}/{subject}", headers=api.admin.headers
        )
        assert granted.status_code == 200, granted.text


def service_subject(principal: JobPrincipal) -> str:
    return f"service:{principal.principal_id}"


async def team_space(api: Api, name: str, *members: Agent) -> str:
    """A team space its members read, write and delete in."""
    admin = api.admin.headers
    team = (await api.http.post("/v1/teams", json={"name": name}, headers=admin)).json()
    created = await api.http.post("/v1/spaces", json={"name": name}, headers=admin)
    assert created.status_code == 201, created.text
    space_id: str = created.json()["space"]["id"]
    await grant(api, space_id, team["subject"], "read", "write", "delete")
    for member in members:
        added = await api.http.put(
            f"/v1/teams/{team['id']}/members/{member.principal_id}", headers=admin
        )
        assert added.status_code == 200, added.text
    return space_id


@dataclass
class Run:
    counts: Counter[str] = field(default_factory=Counter)
    batches: int = 0


async def run_job(
    runtime: Runtime,
    job: Job,
    principal: JobPrincipal,
    *,
    dry_run: bool = False,
    space_id: str | None = None,
    size: int = 50,
    batch_function: BatchFunction | None = None,
    start: str | None = None,
    **options: str,
) -> Run:
    """Every batch of one run (from the cursor `start`: a run resumed there), each in its own
    call committed with its audit row."""
    scope = RunScope(
        principal.tenant_id,
        None if space_id is None else uuid.UUID(space_id),
        dry_run=dry_run,
        options=options,
    )
    run, cursor = Run(), start
    function = batch_function or job.run_batch
    while True:
        verified = await runtime.verifier.verify(principal.token)
        async with open_call(
            runtime, job.operation, token=verified, method="JOB", route=f"/jobs/{job.name}"
        ) as call:
            assert call.caller is not None
            # The entrance's transaction holds nothing a runner needs: the batch begins its own
            # (a runner that holds a lock in it is `as_the_runner` in the summarizer tests).
            await call.release()
            done = await function(Batch(call, call.caller, runtime, scope, cursor, size))
        run.batches += 1
        run.counts.update(done.counts)
        cursor = done.cursor
        if cursor is None:
            return run
        assert run.batches < 100, "a run that never finishes"


async def summaries(runtime: Runtime, where: str = "TRUE", **params: Any) -> list[dict[str, Any]]:
    """Every summary row as stored (the test oracle), oldest first."""
    from sqlalchemy import text

    async with as_owner(runtime) as conn:
        result = await conn.execute(
            text(
                "SELECT id, space_id, subject, key, value, version, read_requires, derived_from, "
                "superseded_at, superseded_by, retracted_at, expires_at, source, metadata "
                f"FROM memories WHERE kind = 'summary' AND ({where}) ORDER BY recorded_at, id"
            ),
            params,
        )
        return [dict(row) for row in result.mappings().all()]


def live(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r["superseded_at"] is None and r["retracted_at"] is None]
