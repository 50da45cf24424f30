"""History, revert and as-of recall as MCP tools (issue 12), through the official `mcp` client:
the same operations as REST, so the same answers, scopes and problems."""

from __future__ import annotations

import uuid

from service.runtime import Runtime
from tests.fixtures.api import Api
from tests.integration.mcp.support import error_text, mcp_session, payload, serving
from tests.integration.memory.support import memory_rows

KEY = {"subject": "service:billing", "kind": "fact", "key": "deploy.window"}
MID_JAN = "2026-01-15T00:00:00Z"
MID_FEB = "2026-02-15T00:00:00Z"


async def test_history_revert_and_time_travel_through_the_mcp_client(
    api: Api, runtime: Runtime
) -> None:
    alice = await api.new_agent("alice")
    v1 = await api.remember(
        alice, **KEY, value="deploys on tuesday", valid_from="2026-01-01T00:00:00Z"
    )
    v2 = await api.remember(
        alice, **KEY, value="deploys on wednesday", valid_from="2026-02-01T00:00:00Z"
    )
    async with serving(runtime) as base, mcp_session(base, alice.token) as session:
        reverted = payload(await session.call_tool("revert_memory", {"id": v1["id"]}))
        v3 = reverted["memory"]
        history = payload(await session.call_tool("memory_history", {"id": v1["id"]}))
        paged = payload(await session.call_tool("memory_history", {"id": v1["id"], "limit": 2}))
        known = payload(
            await session.call_tool(
                "memory_history",
                {"id": v1["id"], "known_at": v2["provenance"]["recorded_at"]},
            )
        )
        then = payload(
            await session.call_tool(
                "recall", {"query": "when do deploys happen", "k": 3, "as_of": MID_FEB}
            )
        )
        now = payload(await session.call_tool("recall", {"query": "when do deploys happen"}))
        listed = payload(await session.call_tool("list_memories", {"as_of": MID_JAN}))
        got = payload(
            await session.call_tool(
                "get_memory", {"id": v2["id"], "known_at": v2["provenance"]["recorded_at"]}
            )
        )
        not_then = await session.call_tool("get_memory", {"id": v2["id"], "as_of": MID_JAN})
    assert (v3["value"], v3["version"], reverted["superseded"]) == (
        "deploys on tuesday",
        3,
        [v2["id"]],
    )
    assert [i["version"] for i in history["items"]] == [3, 2, 1]
    rest = await api.http.get(f"/v1/memories/{v1['id']}/history", headers=alice.headers)
    assert rest.json() == history
    assert [i["version"] for i in paged["items"]] == [3, 2]
    assert paged["next_cursor"] is not None
    assert [i["version"] for i in known["items"]] == [2, 1]
    assert [h["memory"]["id"] for h in then["hits"]] == [v2["id"]]
    assert [h["memory"]["id"] for h in now["hits"]] == [v3["id"]]
    assert [i["id"] for i in listed["items"]] == [v1["id"]]
    assert got["id"] == v2["id"]
    assert "memory-not-found" in error_text(not_then)


async def test_the_tools_refuse_like_rest_and_change_nothing(api: Api, runtime: Runtime) -> None:
    alice = await api.new_agent("alice")
    reader = await api.new_agent("reader", scopes=("read:memory",))
    bob = await api.new_agent("bob")
    v1 = await api.remember(alice, **KEY, value="deploys on tuesday")
    await api.remember(alice, **KEY, value="deploys on wednesday")
    theirs = await api.remember(bob, **KEY, value="bob's")
    assert (
        await api.http.delete(f"/v1/memories/{v1['id']}", headers=alice.headers)
    ).status_code == 204
    before = await memory_rows(runtime)
    async with serving(runtime) as base:
        async with mcp_session(base, reader.token) as session:
            no_scope = await session.call_tool("revert_memory", {"id": v1["id"]})
        async with mcp_session(base, alice.token) as session:
            stub = await session.call_tool("revert_memory", {"id": v1["id"]})
            foreign = await session.call_tool("memory_history", {"id": theirs["id"]})
            missing = await session.call_tool("memory_history", {"id": str(uuid.uuid4())})
            naive = await session.call_tool(
                "recall", {"query": "deploys", "as_of": "2026-01-01T00:00:00"}
            )
            bad_date = await session.call_tool(
                "memory_history", {"id": v1["id"], "known_at": "yesterday"}
            )
    assert "write:memory" in error_text(no_scope)
    assert "version-retracted" in error_text(stub)
    assert "history" in error_text(stub)
    rest = await api.http.get(f"/v1/memories/{theirs['id']}/history", headers=alice.headers)
    assert error_text(foreign) == (
        f"Memory not found (404 memory-not-found): {rest.json()['detail']}"
    )
    assert "memory-not-found" in error_text(missing)
    assert "invalid-request" in error_text(naive)
    assert "as_of" in error_text(naive)
    assert "invalid-request" in error_text(bad_date)
    assert "known_at" in error_text(bad_date)
    assert await memory_rows(runtime) == before


async def test_history_and_revert_tools_never_name_a_withheld_source(
    api: Api, runtime: Runtime
) -> None:
    """Red-team (rt12 C): `memory_history` named a deleted source's id that `get_memory`
    withholds, and `revert_memory` refused with a 404 naming it. Both answer like GET now."""
    alice = await api.new_agent("alice")
    note = await api.remember(alice, key="note.a", value="first source about invoices")
    kept = await api.remember(alice, key="note.b", value="second source about invoices")
    summary = await api.remember(
        alice,
        kind="summary",
        key="invoices",
        value="invoice summary",
        derived_from=[note["id"], kept["id"]],
    )
    deleted = await api.http.delete(f"/v1/memories/{note['id']}", headers=alice.headers)
    assert deleted.status_code == 204, deleted.text
    async with serving(runtime) as base, mcp_session(base, alice.token) as session:
        got = payload(await session.call_tool("get_memory", {"id": summary["id"]}))
        history = payload(await session.call_tool("memory_history", {"id": summary["id"]}))
        reverted = payload(await session.call_tool("revert_memory", {"id": summary["id"]}))
    assert history["items"][0]["provenance"] == got["provenance"]
    assert got["provenance"]["derived_from"] == [kept["id"]]
    assert got["provenance"]["derived_from_withheld"] == 1
    assert reverted["memory"]["provenance"]["derived_from"] == [kept["id"]]
    assert reverted["reverted"]["sources_dropped"] == 1
    assert note["id"] not in str([got, history, reverted])
