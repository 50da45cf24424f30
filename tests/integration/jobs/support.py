"""Helpers of the job tests: a tenant with a team space and the job principal granted on it,
expired memories, runs queued through the API, and what is really stored (as the owner)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from service.jobs.declare import Job
from service.jobs.principals import job_principal_id
from service.jobs.registry import JOBS
from service.jobs.runner import Runner
from tests.fixtures.api import Agent, Api
from tests.integration.memory.support import as_owner, scalar

RUN_JOBS = "run:jobs"


@dataclass
class Setup:
    api: Api
    writer: Agent
    space_id: str
    job_principal: str

    @property
    def tenant(self) -> uuid.UUID:
        return uuid.UUID(self.api.tenant_id)


async def new_space(api: Api, name: str) -> str:
    response = await api.http.post(
        "/v1/spaces", json={"name": name, "kind": "team"}, headers=api.admin.headers
    )
    assert response.status_code == 201, response.text
    space_id: str = response.json()["space"]["id"]
    return space_id


async def grant(api: Api, space_id: str, action: str, subject: str) -> None:
    response = await api.http.put(
        f"/v1/spaces/{space_id}/grants/{action}/{subject}", headers=api.admin.headers
    )
    assert response.status_code == 200, response.text


async def revoke(api: Api, space_id: str, action: str, subject: str) -> None:
    response = await api.http.delete(
        f"/v1/spaces/{space_id}/grants/{action}/{subject}", headers=api.admin.headers
    )
    assert response.status_code == 200, response.text


async def setup(
    api: Api, *, job_actions: tuple[str, ...] = ("read", "delete"), starter_reads: bool = True
) -> Setup:
    """`starter_reads`: the admin, who starts the runs through the API, may read the team
    space (a run started by a caller stays inside what that caller may read)."""
    space_id = await new_space(api, "team")
    writer = await api.new_agent("writer")
    for action in ("read", "write", "delete"):
        await grant(api, space_id, action, f"user:{writer.principal_id}")
    if starter_reads:
        await grant(api, space_id, "read", f"user:{api.admin.principal_id}")
    job = str(job_principal_id(uuid.UUID(api.tenant_id)))
    await make_job_principal(api)
    for action in job_actions:
        await grant(api, space_id, action, f"service:{job}")
    return Setup(api, writer, space_id, job)


async def make_job_principal(api: Api) -> None:
    """Queue (and leave) a dry run so the tenant's job principal exists before it is granted."""
    response = await start(api, "memory.sweep_expired", dry_run=True)
    assert response.status_code == 202, response.text


async def start(api: Api, name: str, **body: Any) -> Any:
    return await api.http.post(f"/v1/jobs/{name}/runs", json=body, headers=api.admin.headers)


async def queue(api: Api, name: str, **body: Any) -> uuid.UUID:
    response = await start(api, name, **body)
    assert response.status_code == 202, response.text
    return uuid.UUID(response.json()["id"])


async def run_of(api: Api, run_id: uuid.UUID) -> dict[str, Any]:
    response = await api.http.get(f"/v1/jobs/runs/{run_id}", headers=api.admin.headers)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def runner(api: Api, jobs: Mapping[str, Job] = JOBS, size: int = 3) -> Runner:
    return Runner(api.runtime, jobs, batch_size=size)


async def expire(api: Api, memory_ids: list[str], days_ago: int) -> None:
    """Move the memories' expiry into the past (as the owner: no API writes the past)."""
    async with as_owner(api.runtime) as conn:
        from sqlalchemy import text

        await conn.execute(
            text(
                "UPDATE memories SET expires_at = now() - make_interval(days => :days) "
                "WHERE id = ANY(CAST(:ids AS uuid[]))"
            ),
            {"days": days_ago, "ids": memory_ids},
        )
        await conn.commit()


async def stored_ids(api: Api) -> set[str]:
    async with as_owner(api.runtime) as conn:
        from sqlalchemy import text

        rows = await conn.execute(text("SELECT id::text FROM memories"))
        return {row[0] for row in rows}


async def audit_rows(api: Api, action: str, run_id: uuid.UUID) -> list[dict[str, Any]]:
    """The audit rows of one run's batches (each names the run among its targets)."""
    async with as_owner(api.runtime) as conn:
        from sqlalchemy import text

        rows = await conn.execute(
            text(
                "SELECT action, decision, reason, status, result_count, target_ids::text[] AS t "
                "FROM audit_events WHERE tenant_id = :tenant AND action = :action "
                "AND CAST(:run AS uuid) = ANY(target_ids) ORDER BY seq"
            ),
            {"tenant": api.tenant_id, "action": action, "run": str(run_id)},
        )
        return [dict(row) for row in rows.mappings()]


__all__ = ["scalar"]
