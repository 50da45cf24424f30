"""Helpers of the revocation tests: revoke, reinstate, and what each read surface shows."""

from __future__ import annotations

from typing import Any

import httpx

from service.runtime import Runtime
from tests.fixtures.api import Agent, Api
from tests.integration.mcp.support import mcp_session, payload, serving


async def revoke(api: Api, agent: Agent, memory_id: str, reason: str = "withdrawn") -> Any:
    response = await api.http.post(
        f"/v1/memories/{memory_id}/revoke", json={"reason": reason}, headers=agent.headers
    )
    assert response.status_code == 200, response.text
    return response.json()


async def reinstate(api: Api, agent: Agent, memory_id: str, reason: str = "restored") -> Any:
    response = await api.http.post(
        f"/v1/memories/{memory_id}/reinstate", json={"reason": reason}, headers=agent.headers
    )
    assert response.status_code == 200, response.text
    return response.json()


async def post(api: Api, agent: Agent, path: str, body: dict[str, Any]) -> httpx.Response:
    response: httpx.Response = await api.http.post(path, json=body, headers=agent.headers)
    return response


async def surfaces(api: Api, agent: Agent, query: str, ids: list[str]) -> dict[str, set[str]]:
    """Which of `ids` each REST read surface shows `agent`."""
    wanted = set(ids)
    seen: dict[str, set[str]] = {}
    for mode in ("vector", "lexical", "hybrid"):
        found = await api.search(agent, query, k=50, min_score=0, mode=mode)
        assert found.status_code == 200, found.text
        seen[f"search:{mode}"] = {h["memory"]["id"] for h in found.json()["hits"]} & wanted
    listed = await api.http.get("/v1/memories", params={"limit": 100}, headers=agent.headers)
    seen["list"] = {i["id"] for i in listed.json()["items"]} & wanted
    got: set[str] = set()
    history: set[str] = set()
    for memory_id in ids:
        one = await api.http.get(f"/v1/memories/{memory_id}", headers=agent.headers)
        if one.status_code == 200:
            got.add(memory_id)
        chain = await api.http.get(f"/v1/memories/{memory_id}/history", headers=agent.headers)
        if chain.status_code == 200:
            history |= {i["id"] for i in chain.json()["items"]} & wanted
    seen["get"], seen["history"] = got, history
    return seen


async def counts(api: Api, agent: Agent) -> int:
    response = await api.http.get("/v1/memories/counts", headers=agent.headers)
    assert response.status_code == 200, response.text
    total: int = response.json()["total"]
    return total


async def mcp_surfaces(
    runtime: Runtime, agent: Agent, query: str, ids: list[str]
) -> dict[str, set[str]]:
    """Which of `ids` the MCP tools recall, get_memory, list_memories, memory_history show."""
    wanted = set(ids)
    async with serving(runtime) as base, mcp_session(base, agent.token) as session:
        recalled = payload(
            await session.call_tool("recall", {"query": query, "k": 50, "min_score": 0})
        )
        listed = payload(await session.call_tool("list_memories", {"limit": 100}))
        got: set[str] = set()
        history: set[str] = set()
        for memory_id in ids:
            one = await session.call_tool("get_memory", {"id": memory_id})
            if not one.is_error:
                got.add(memory_id)
            chain = await session.call_tool("memory_history", {"id": memory_id})
            if not chain.is_error:
                history |= {i["id"] for i in payload(chain)["items"]} & wanted
    return {
        "mcp:recall": {h["memory"]["id"] for h in recalled["hits"]} & wanted,
        "mcp:list": {i["id"] for i in listed["items"]} & wanted,
        "mcp:get": got,
        "mcp:history": history,
    }
