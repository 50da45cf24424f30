"""MCP at /mcp over real HTTP with the official `mcp` client: the memory tools answer like the
REST routes (same tokens, scopes, visibility, problems and JSON), one audit row per tool call,
and a tool's writes are committed before its result arrives."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
from mcp.shared.exceptions import MCPError
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from sqlalchemy.ext.asyncio import AsyncEngine

from service.mcp.tools import TOOLS
from service.runtime import Runtime
from tests.fixtures.api import Api
from tests.integration.audit.support import audit_rows
from tests.integration.mcp.support import error_text, mcp_session, payload, serving
from tests.integration.memory.support import count_memories

NOTE = {"subject": "service:billing", "kind": "fact", "key": "deploy.window", "value": "Fridays"}
TOOL_ACTIONS = {
    "remember": "memory.write",
    "remember_many": "memory.write_batch",
    "recall": "memory.search",
    "get_memory": "memory.get",
    "memory_history": "memory.history",
    "revert_memory": "memory.revert",
    "list_memories": "memory.list",
    "count_memories": "memory.count",
    "forget": "memory.delete",
    "list_proposals": "memory.list_proposals",
    "approve": "memory.approve",
    "reject": "memory.reject",
    "revoke": "memory.revoke",
    "reinstate": "memory.reinstate",
    "request_consolidation": "jobs.start",
}


async def test_tools_list_names_every_memory_operation_with_its_schema(
    api: Api, runtime: Runtime
) -> None:
    alice = await api.new_agent("alice", scopes=("write:memory",))
    async with serving(runtime) as base, mcp_session(base, alice.token) as session:
        listed = (await session.list_tools()).tools
    tools = {t.name: t for t in listed}
    assert list(tools) == list(TOOL_ACTIONS)
    assert {name: t.operation.name for name, t in TOOLS.items()} == TOOL_ACTIONS
    remember = tools["remember"].input_schema
    assert remember["type"] == "object"
    assert remember["additionalProperties"] is False
    assert set(remember["required"]) == {"subject", "kind", "key", "value"}
    assert remember["properties"]["kind"]["enum"] == sorted(
        ["fact", "preference", "decision", "episode", "summary", "document"]
    )
    recall = tools["recall"].input_schema
    assert recall["required"] == ["query"]
    assert recall["properties"]["filters"]["anyOf"][0] == {"$ref": "#/$defs/SearchFilters"}
    assert recall["$defs"]["SearchFilters"]["additionalProperties"] is False
    assert tools["get_memory"].input_schema["required"] == ["id"]
    assert tools["forget"].annotations is not None
    assert tools["forget"].annotations.destructive_hint is True
    assert tools["recall"].annotations is not None
    assert tools["recall"].annotations.read_only_hint is True
    assert "`delete:memory`" in (tools["forget"].description or "")


async def test_remember_then_recall_and_the_write_is_committed_before_the_result(
    api: Api, runtime: Runtime
) -> None:
    alice = await api.new_agent("alice", token_scope="read:memory write:memory")
    async with serving(runtime) as base, mcp_session(base, alice.token) as session:
        written = payload(await session.call_tool("remember", NOTE))
        memory = written["memory"]
        # Right after the result: another connection (REST) and another MCP client see it.
        rest = await api.http.get(f"/v1/memories/{memory['id']}", headers=alice.headers)
        async with mcp_session(base, alice.token) as second:
            again = payload(await second.call_tool("get_memory", {"id": memory["id"]}))
        # "Fridays" shares nothing with the query: the floor is off to see the write.
        recall = {"query": "deploy window", "k": 3, "min_score": 0}
        recalled = payload(await session.call_tool("recall", recall))
        listed = payload(await session.call_tool("list_memories", {"kind": "fact"}))
        counted = payload(await session.call_tool("count_memories", {"group_by": "kind"}))
    assert {k: memory[k] for k in NOTE} == NOTE
    assert written["superseded"] == []
    assert rest.status_code == 200
    assert rest.json() == memory == again
    assert [hit["memory"]["id"] for hit in recalled["hits"]] == [memory["id"]]
    assert recalled["hits"][0]["memory"]["value"] == "Fridays"
    assert recalled["k"] == 3
    assert [item["id"] for item in listed["items"]] == [memory["id"]]
    assert counted == {
        "total": 1,
        "group_by": "kind",
        "groups": [{"value": "fact", "count": 1}],
        "more_groups": False,
    }


async def test_recall_answers_nothing_relevant_as_an_empty_list(api: Api, runtime: Runtime) -> None:
    """The recall tool takes `mode` and `min_score` by the search operation's declaration: an
    unrelated question is an empty list under the default floor in every mode, the floor
    turned off brings the stranger back, and a lexical recall finds the identifier."""
    alice = await api.new_agent("alice", token_scope="read:memory write:memory")
    note = NOTE | {"value": "redis-cache-07 listens on port 6380"}
    async with serving(runtime) as base, mcp_session(base, alice.token) as session:
        schema = {t.name: t for t in (await session.list_tools()).tools}["recall"].input_schema
        written = payload(await session.call_tool("remember", note))["memory"]
        question = "What is the capital of Australia?"
        nothing = {
            mode: payload(await session.call_tool("recall", {"query": question, "mode": mode}))
            for mode in ("hybrid", "vector", "lexical")
        }
        stranger = payload(await session.call_tool("recall", {"query": question, "min_score": 0}))
        by_word = payload(
            await session.call_tool("recall", {"query": "redis-cache-07", "mode": "lexical"})
        )
    assert schema["properties"]["mode"]["enum"] == ["hybrid", "lexical", "vector"]
    assert "min_score" in schema["properties"]
    for mode, answer in nothing.items():
        assert answer["hits"] == [], mode
        assert answer["min_score"] == 0.25
    assert [hit["memory"]["id"] for hit in stranger["hits"]] == [written["id"]]
    assert [hit["memory"]["id"] for hit in by_word["hits"]] == [written["id"]]
    assert by_word["hits"][0]["lexical_score"] == pytest.approx(1.0)


async def test_a_missing_scope_is_refused_like_rest_and_writes_nothing(
    api: Api, runtime: Runtime, owner_engine: AsyncEngine
) -> None:
    reader = await api.new_agent("reader", scopes=("read:memory",))
    before = await count_memories(runtime)
    rest = await api.http.post("/v1/memories", json=NOTE, headers=reader.headers)
    async with serving(runtime) as base, mcp_session(base, reader.token) as session:
        refused = await session.call_tool("remember", NOTE)
        forget = await session.call_tool("forget", {"id": str(uuid.uuid4())})
    assert rest.status_code == 403
    problem = rest.json()
    assert (
        error_text(refused) == f"Insufficient scope (403 insufficient-scope): {problem['detail']}"
    )
    assert refused.structured_content == {**problem, "instance": "/mcp"}
    assert "delete:memory" in error_text(forget)
    assert await count_memories(runtime) == before
    tool_rows = [r for r in await audit_rows(owner_engine) if r["route"] == "/mcp"]
    denied = [r for r in tool_rows if r["action"] == "memory.write"]
    assert [(r["decision"], r["status"], r["reason"]) for r in denied] == [
        ("deny", 403, "insufficient-scope")
    ]


async def test_another_principals_memory_answers_exactly_like_rest(
    api: Api, runtime: Runtime
) -> None:
    alice = await api.new_agent("alice")
    bob = await api.new_agent("bob")
    bobs = await api.remember(bob, value="bob's private note")
    other = await api.other_tenant()
    carol = await other.new_agent("carol")
    theirs = await other.remember(carol, value="another tenant's note")
    before = await count_memories(runtime)
    async with serving(runtime) as base, mcp_session(base, alice.token) as session:
        for memory_id in (bobs["id"], theirs["id"], str(uuid.uuid4())):
            rest = await api.http.get(f"/v1/memories/{memory_id}", headers=alice.headers)
            assert rest.status_code == 404
            problem = rest.json()
            got = await session.call_tool("get_memory", {"id": memory_id})
            assert (
                error_text(got) == f"Memory not found (404 memory-not-found): {problem['detail']}"
            )
            assert got.structured_content == {**problem, "instance": "/mcp"}
            gone = await session.call_tool("forget", {"id": memory_id})
            assert error_text(gone) == error_text(got)
        recalled = payload(await session.call_tool("recall", {"query": "private note"}))
    assert recalled["hits"] == []
    assert await count_memories(runtime) == before


@pytest.mark.parametrize(
    ("tool", "arguments", "slug", "words"),
    [
        ("remember", {**NOTE, "colour": "red"}, "invalid-request", "unknown field `colour`"),
        ("remember", {**NOTE, "ttl_seconds": "60"}, "invalid-request", "ttl_seconds: Expected"),
        ("remember", {**NOTE, "value": "  "}, "invalid-request", "at least one non-space"),
        ("recall", {"query": "x", "k": "3"}, "invalid-request", "k: Expected `int | null`"),
        ("recall", {"query": "x", "filters": {"space_id": "nope"}}, "malformed-id", "not a UUID"),
        ("recall", {"query": "x", "k": 10_000}, "k-out-of-range", "k"),
        ("get_memory", {"id": "not-an-id"}, "malformed-id", "'not-an-id' is not a UUID"),
        ("get_memory", {}, "invalid-request", "missing required field `id`"),
        ("list_memories", {"cursor": "forged"}, "bad-cursor", "cursor"),
    ],
)
async def test_bad_input_is_a_correctable_error_and_changes_nothing(
    api: Api, runtime: Runtime, tool: str, arguments: dict[str, Any], slug: str, words: str
) -> None:
    alice = await api.new_agent("alice")
    before = await count_memories(runtime)
    async with serving(runtime) as base, mcp_session(base, alice.token) as session:
        result = await session.call_tool(tool, arguments)
    text = error_text(result)
    assert result.structured_content is not None
    assert result.structured_content["type"].endswith("/" + slug), text
    assert words in text
    assert "Traceback" not in text
    assert "File " not in text
    assert await count_memories(runtime) == before


async def test_rest_and_mcp_bad_ids_read_the_same(api: Api, runtime: Runtime) -> None:
    alice = await api.new_agent("alice")
    rest = await api.http.get("/v1/memories/not-an-id", headers=alice.headers)
    async with serving(runtime) as base, mcp_session(base, alice.token) as session:
        got = await session.call_tool("get_memory", {"id": "not-an-id"})
    assert error_text(got) == f"Malformed id (400 malformed-id): {rest.json()['detail']}"


async def test_an_unknown_tool_is_a_protocol_error(api: Api, runtime: Runtime) -> None:
    alice = await api.new_agent("alice")
    async with serving(runtime) as base, mcp_session(base, alice.token) as session:
        with pytest.raises(MCPError, match="tools/list names the tools"):
            await session.call_tool("drop_everything", {})


async def test_one_audit_row_per_tool_call_with_its_operation(
    api: Api, runtime: Runtime, owner_engine: AsyncEngine
) -> None:
    alice = await api.new_agent("alice")
    listed = await api.http.get("/v1/memories", headers=alice.headers)
    assert listed.status_code == 200
    async with serving(runtime) as base, mcp_session(base, alice.token) as session:
        await session.list_tools()
        memory = payload(await session.call_tool("remember", NOTE))["memory"]
        await session.call_tool("recall", {"query": "deploy", "min_score": 0})
        await session.call_tool("get_memory", {"id": memory["id"]})
        await session.call_tool("list_memories", {})
        await session.call_tool("count_memories", {})
        await session.call_tool("get_memory", {"id": str(uuid.uuid4())})
        await session.call_tool("forget", {"id": memory["id"]})
    rows = await audit_rows(owner_engine)
    [rest_row] = [r for r in rows if r["route"] == "/v1/memories"]
    mcp_rows = [r for r in rows if r["route"] == "/mcp"]
    tool_rows = [r for r in mcp_rows if r["action"] != "mcp.exchange"]
    assert [(r["action"], r["decision"], r["status"]) for r in tool_rows] == [
        # The status REST answers for the same operation: a tool's row reads like REST's.
        ("memory.write", "allow", 201),
        ("memory.search", "allow", 200),
        ("memory.get", "allow", 200),
        ("memory.list", "allow", 200),
        ("memory.count", "allow", 200),
        ("memory.get", "deny", 404),
        ("memory.delete", "allow", 204),
    ]
    for row in mcp_rows:
        assert row["method"] == "POST"
        assert row["actor"] == rest_row["actor"]
        assert row["client_id"] == alice.client_id
        assert str(row["tenant_id"]) == api.tenant_id
    # Each tool call's exchange left exactly one row (the tool's), under its request id.
    per_request: dict[str, list[str]] = {}
    for row in mcp_rows:
        per_request.setdefault(row["request_id"], []).append(row["action"])
    assert sorted(len(actions) for actions in per_request.values()) == [1] * len(per_request)
    # initialize, the initialized notification and tools/list: the exchange's own rows.
    assert [r["status"] for r in mcp_rows if r["action"] == "mcp.exchange"] == [200, 202, 200]
    write = tool_rows[0]
    assert memory["id"] in {str(t) for t in write["target_ids"]}
    assert tool_rows[1]["result_count"] == 1


async def test_tool_calls_are_traced_under_the_request_without_content(
    api: Api,
    runtime: Runtime,
    owner_engine: AsyncEngine,
    span_exporter: InMemorySpanExporter,
) -> None:
    alice = await api.new_agent("alice")
    canary = "c4nary-mcp-5e1f"
    async with serving(runtime) as base, mcp_session(base, alice.token) as session:
        span_exporter.clear()
        await session.call_tool("remember", {**NOTE, "value": canary, "key": canary})
        with pytest.raises(MCPError):
            await session.call_tool(canary, {})
        async with httpx.AsyncClient(base_url=base, headers=alice.headers) as http:
            unknown = await http.post(
                "/mcp",
                json={"jsonrpc": "2.0", "id": 9, "method": canary},
                headers={"accept": "application/json, text/event-stream"},
            )
        assert unknown.json()["error"]["code"] == -32601
    spans = span_exporter.get_finished_spans()
    [tool_span] = [s for s in spans if s.attributes and s.attributes.get("mcp.tool.name")]
    assert tool_span.name == "mcp tools/call"
    assert tool_span.attributes == {"mcp.method.name": "tools/call", "mcp.tool.name": "remember"}
    [server_span] = [
        s
        for s in spans
        if s.name == "POST /mcp"
        and s.context is not None
        and tool_span.context is not None
        and s.context.trace_id == tool_span.context.trace_id
    ]
    assert server_span.parent is None or server_span.parent.trace_id == server_span.context.trace_id
    names = {s.name for s in spans}
    assert {"audit.append", "embedding.embed"} <= names
    # The server's spans (the test's MCP client traces its own sends, named after the tool).
    for recorded in (s for s in spans if s.kind != SpanKind.CLIENT):
        assert canary not in recorded.name
        for value in (recorded.attributes or {}).values():
            assert canary not in str(value)
    [row] = [r for r in await audit_rows(owner_engine) if r["action"] == "memory.write"]
    assert row["trace_id"] == format(tool_span.context.trace_id, "032x")


async def test_exchanges_without_a_tool_call_keep_their_own_row(
    api: Api, runtime: Runtime, owner_engine: AsyncEngine
) -> None:
    alice = await api.new_agent("alice")
    accept = {"accept": "application/json, text/event-stream"}
    async with (
        serving(runtime) as base,
        httpx.AsyncClient(base_url=base, headers=alice.headers, timeout=5) as http,
    ):
        # No standalone stream on a stateless server: refused at once, not held open.
        stream = await http.get("/mcp", headers={"accept": "text/event-stream"})
        broken = await http.post(
            "/mcp", content=b"{nope", headers={**accept, "content-type": "application/json"}
        )
        ping = await http.post(
            "/mcp", json={"jsonrpc": "2.0", "id": 7, "method": "ping"}, headers=accept
        )
    assert stream.status_code == 405
    assert stream.headers["allow"] == "POST"
    assert "POST each JSON-RPC message" in stream.json()["error"]["message"]
    assert broken.status_code == 400
    assert broken.json()["error"]["code"] == -32700
    assert ping.json() == {"jsonrpc": "2.0", "id": 7, "result": {}}
    rows = [r for r in await audit_rows(owner_engine) if r["route"] == "/mcp"]
    assert [(r["action"], r["method"], r["status"], r["decision"]) for r in rows] == [
        ("mcp.exchange", "GET", 405, "deny"),
        ("mcp.exchange", "POST", 400, "deny"),
        ("mcp.exchange", "POST", 200, "allow"),
    ]


async def test_a_protocol_refusal_is_audited_as_a_refusal_not_as_ok(
    api: Api, runtime: Runtime, owner_engine: AsyncEngine
) -> None:
    """JSON-RPC errors travel in a 200 answer; the exchange's audit row records what was
    refused (the status REST would answer and why), never `allow`/`ok`."""
    alice = await api.new_agent("alice")
    accept = {"accept": "application/json, text/event-stream"}
    async with serving(runtime) as base, mcp_session(base, alice.token) as session:
        with pytest.raises(MCPError):
            await session.call_tool("drop_everything", {})
        async with httpx.AsyncClient(base_url=base, headers=alice.headers, timeout=5) as http:
            unknown = await http.post(
                "/mcp", json={"jsonrpc": "2.0", "id": 3, "method": "no/such"}, headers=accept
            )
    assert unknown.status_code == 200
    assert unknown.json()["error"]["code"] == -32601
    rows = [r for r in await audit_rows(owner_engine) if r["route"] == "/mcp"]
    refused = [(r["status"], r["decision"], r["reason"]) for r in rows if r["status"] >= 400]
    assert refused == [
        (422, "deny", "mcp-invalid-params"),
        (404, "deny", "mcp-method-not-found"),
    ]
    # The handshake (initialize, the initialized notification) stays what it was: allowed.
    handshake = [(r["status"], r["decision"], r["reason"]) for r in rows if r["status"] < 400]
    assert handshake == [(200, "allow", "ok"), (202, "allow", "ok")]
