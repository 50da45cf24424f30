"""Safe retries and edits over MCP (issue 15): the tools of idempotent operations take an
`idempotency_key`, the tools of changes an `if_match`, with REST's answers and problems,
through the official `mcp` client against a real uvicorn."""

from __future__ import annotations

from service.mcp.tools import IDEMPOTENCY_KEY, TOOLS
from service.runtime import Runtime
from tests.fixtures.api import Api
from tests.integration.mcp.support import error_text, mcp_session, payload, serving
from tests.integration.memory.support import count_memories, memory_rows

KEY = {"subject": "service:billing", "kind": "fact", "key": "deploy.window", "new_key": True}


def test_every_tool_of_an_idempotent_operation_takes_a_key() -> None:
    for tool in TOOLS.values():
        properties = tool.input_schema()["properties"]
        assert (IDEMPOTENCY_KEY in properties) is tool.operation.idempotent, tool.name
        assert ("if_match" in properties) is tool.operation.conditional, tool.name
    assert {t.name for t in TOOLS.values() if t.operation.idempotent} >= {
        "remember",
        "remember_many",
        "forget",
        "revert_memory",
    }


async def test_a_retried_tool_call_with_its_key_writes_once(api: Api, runtime: Runtime) -> None:
    alice = await api.new_agent("alice")
    arguments = {**KEY, "value": "deploys on tuesday", IDEMPOTENCY_KEY: "mcp-1"}
    before = await count_memories(runtime)
    async with serving(runtime) as base, mcp_session(base, alice.token) as session:
        first = payload(await session.call_tool("remember", arguments))
        again = payload(await session.call_tool("remember", arguments))
        other = await session.call_tool("remember", {**arguments, "value": "deploys on friday"})
        batch = {"items": [{**KEY, "key": "b", "value": "b"}], IDEMPOTENCY_KEY: "mcp-2"}
        many = [payload(await session.call_tool("remember_many", batch)) for _ in range(2)]
        forget = {"id": first["memory"]["id"], IDEMPOTENCY_KEY: "mcp-3"}
        deleted = [payload(await session.call_tool("forget", forget)) for _ in range(2)]
        bad_key = await session.call_tool("remember", {**arguments, IDEMPOTENCY_KEY: "has space"})
    assert again == first
    assert "idempotency-key-reused" in error_text(other)
    assert many[0] == many[1]
    assert deleted[0] == deleted[1] == {"deleted": first["memory"]["id"]}
    assert "invalid-request" in error_text(bad_key)
    assert await count_memories(runtime) == before + 2
    # The REST key space is the caller's too, but a tool call is not the REST route: 422.
    rest = await api.http.post(
        "/v1/memories",
        json={**KEY, "value": "deploys on tuesday"},
        headers={**alice.headers, "Idempotency-Key": "mcp-1"},
    )
    assert rest.status_code == 422, rest.text


async def test_if_match_on_tools_refuses_a_stale_version(api: Api, runtime: Runtime) -> None:
    alice = await api.new_agent("alice")
    v1 = await api.remember(alice, **KEY, value="deploys on tuesday")
    v2 = await api.remember(alice, **KEY, value="deploys on friday")
    before = await memory_rows(runtime)
    async with serving(runtime) as base, mcp_session(base, alice.token) as session:
        stale = v1["etag"]
        write = await session.call_tool("remember", {**KEY, "value": "x", "if_match": stale})
        revert = await session.call_tool("revert_memory", {"id": v1["id"], "if_match": stale})
        forget = await session.call_tool("forget", {"id": v2["id"], "if_match": stale})
        for refused in (write, revert, forget):
            assert "precondition-failed" in error_text(refused)
            assert refused.structured_content is not None
            assert refused.structured_content["current_etag"] == v2["etag"]
        assert await memory_rows(runtime) == before
        done = payload(
            await session.call_tool("revert_memory", {"id": v1["id"], "if_match": v2["etag"]})
        )
    assert done["memory"]["value"] == "deploys on tuesday"
    assert done["superseded"] == [v2["id"]]
