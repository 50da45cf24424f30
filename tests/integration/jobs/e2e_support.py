"""Helpers of the end-to-end job tests: the issue's leak world with the tenant's own job
principal (the one the runner runs as) granted through the API, a run queued through the API
and taken to its end by the real runner, and every probe a member can make (REST in every
search mode, list, get, history, counts; MCP recall with the official client)."""

from __future__ import annotations

import uuid
from typing import Any

from service.jobs.principals import job_principal_id
from tests.fixtures.api import Agent, Api
from tests.integration.jobs.consolidation_support import JobPrincipal
from tests.integration.jobs.support import make_job_principal, queue, run_of, runner
from tests.integration.jobs.world import (
    World,
    build_for,
)
from tests.integration.mcp.support import mcp_session, payload, serving
from tests.integration.memory.support import assert_problem

MODES = ("hybrid", "vector", "lexical")


def job_subject(api: Api) -> str:
    """The policy subject of the tenant's job principal."""
    return f"service:{job_principal_id(uuid.UUID(api.tenant_id))}"


async def leak_world(api: Api, *job_actions: str) -> World:
    """The world of tests/integration/jobs/world.py with the tenant's job principal (not a
    stand-in service principal) granted `job_actions` on both team spaces, and the admin, who
    starts the runs through the API, reading them (a run stays inside what its starter reads,
    docs/jobs.md "Who a run acts as"; the admin is no member probed here). The job principal
    has no token of its own: the runner signs one per batch."""
    await make_job_principal(api)
    tenant = uuid.UUID(api.tenant_id)
    job = JobPrincipal(tenant, job_principal_id(tenant), "")
    return await build_for(
        api, job, job_subject(api), job_actions, f"user:{api.admin.principal_id}"
    )


async def run_through_runner(api: Api, name: str, *, size: int = 3, **body: Any) -> dict[str, Any]:
    """Queue `name` through the API as the tenant's `run:jobs` admin, take the run to its end
    with the real runner (batches of `size`), and answer the run as `GET /v1/jobs/runs/{id}`
    shows it."""
    run_id = await queue(api, name, **body)
    await runner(api, size=size).run(uuid.UUID(api.tenant_id), run_id)
    return await run_of(api, run_id)


async def rest_probes(
    api: Api, agent: Agent, queries: tuple[str, ...], summary_ids: list[str]
) -> list[dict[str, Any]]:
    """Every memory one member's REST probes return: searches in every mode (floor off), the
    list, a get and a history of every summary id (a hidden one answers 404 on both)."""
    seen: list[dict[str, Any]] = []
    for mode in MODES:
        for query in queries:
            found = await api.search(agent, query, k=100, min_score=0, mode=mode)
            assert found.status_code == 200, found.text
            seen += [hit["memory"] for hit in found.json()["hits"]]
    listed = await api.http.get("/v1/memories", params={"limit": 100}, headers=agent.headers)
    assert listed.status_code == 200, listed.text
    seen += listed.json()["items"]
    for memory_id in summary_ids:
        got = await api.http.get(f"/v1/memories/{memory_id}", headers=agent.headers)
        history = await api.http.get(f"/v1/memories/{memory_id}/history", headers=agent.headers)
        if got.status_code == 200:
            seen.append(got.json())
            assert history.status_code == 200, history.text
            seen += history.json()["items"]
        else:
            assert_problem(got, 404, "memory-not-found")
            assert_problem(history, 404, "memory-not-found")
    return seen


async def summaries_counted(api: Api, agent: Agent) -> int:
    counted = await api.http.get(
        "/v1/memories/counts", params={"group_by": "kind"}, headers=agent.headers
    )
    assert counted.status_code == 200, counted.text
    groups = {g["value"]: g["count"] for g in counted.json()["groups"]}
    return int(groups.get("summary", 0))


async def mcp_recalls(
    api: Api, agents: dict[str, Agent], queries: tuple[str, ...]
) -> dict[str, list[dict[str, Any]]]:
    """By member: every memory the MCP `recall` tool answered it (official client, one served
    app for all)."""
    seen: dict[str, list[dict[str, Any]]] = {}
    async with serving(api.runtime) as base:
        for name, agent in agents.items():
            seen[name] = []
            async with mcp_session(base, agent.token) as session:
                for query in queries:
                    answer = payload(await session.call_tool("recall", {"query": query, "k": 50}))
                    seen[name] += [hit["memory"] for hit in answer["hits"]]
    return seen
