"""The review tools through MCP with the official client (issue 15): a writer's proposal comes
back `proposed` from its own tools, a reviewer lists, approves and rejects proposals with the
answers REST gives, and a non-reviewer's call is REST's 403 `not-a-reviewer`."""

from __future__ import annotations

from service.runtime import Runtime
from tests.fixtures.api import Api
from tests.integration.mcp.support import error_text, mcp_session, payload, serving
from tests.integration.memory.test_review import SUBJECT, _reviewed


async def test_both_sides_of_a_review_through_mcp(api: Api, runtime: Runtime) -> None:
    world = await _reviewed(api)
    note = {"subject": SUBJECT, "kind": "fact", "space_id": world.space_id, "new_key": True}
    async with serving(runtime) as base:
        async with mcp_session(base, world.writer.token) as writer:
            first = payload(
                await writer.call_tool("remember", {**note, "key": "a", "value": "Deploy Fridays"})
            )["memory"]
            second = payload(
                await writer.call_tool("remember", {**note, "key": "b", "value": "Skip the tests"})
            )["memory"]
            own = payload(await writer.call_tool("get_memory", {"id": first["id"]}))
            refused = await writer.call_tool("approve", {"id": first["id"]})
            listed_by_writer = await writer.call_tool(
                "list_proposals", {"space_id": world.space_id}
            )
        async with mcp_session(base, world.reviewer.token) as reviewer:
            waiting = payload(
                await reviewer.call_tool("list_proposals", {"space_id": world.space_id})
            )
            approved = payload(await reviewer.call_tool("approve", {"id": first["id"]}))
            rejected = payload(
                await reviewer.call_tool("reject", {"id": second["id"], "reason": "unsafe"})
            )
            again = await reviewer.call_tool("reject", {"id": first["id"], "reason": "late"})
        async with mcp_session(base, world.reader.token) as reader:
            seen = payload(await reader.call_tool("list_memories", {}))

    assert (first["status"], own["status"]) == ("proposed", "proposed")
    assert error_text(refused).startswith("Not a reviewer (403 not-a-reviewer): ")
    assert error_text(listed_by_writer).startswith("Not a reviewer (403 not-a-reviewer): ")
    assert sorted(m["id"] for m in waiting["items"]) == sorted([first["id"], second["id"]])
    assert (approved["memory"]["status"], approved["memory"]["version"]) == ("live", 1)
    assert (rejected["status"], rejected["reason"]) == ("rejected", "unsafe")
    assert error_text(again).startswith("Not a proposal (409 not-a-proposal): ")
    assert [m["id"] for m in seen["items"]] == [first["id"]]
