"""The write gate through MCP with the official client (issue 12): `remember` takes `new_key`,
and a key new to a known subject comes back as a correctable tool error that lists the keys,
in words a model reads and as REST's problem body."""

from __future__ import annotations

from service.mcp.tools import TOOLS
from service.runtime import Runtime
from tests.fixtures.api import Api
from tests.integration.mcp.support import error_text, mcp_session, payload, serving

WINDOW = {
    "subject": "service:billing",
    "kind": "fact",
    "key": "deploy.window",
    "value": "Deploys run on Tuesdays",
}


async def test_remember_offers_the_keys_then_takes_the_choice(api: Api, runtime: Runtime) -> None:
    assert TOOLS["remember"].input_schema()["properties"]["new_key"]["type"] == "boolean"
    alice = await api.new_agent("alice", token_scope="read:memory write:memory")
    async with serving(runtime) as base, mcp_session(base, alice.token) as session:
        window = payload(await session.call_tool("remember", WINDOW))["memory"]
        update = {**WINDOW, "key": "deploy.day", "value": "Deploys run on Thursdays"}
        refused = await session.call_tool("remember", update)
        rest = await api.http.post(
            "/v1/memories", json={**update, "new_key": False}, headers=alice.headers
        )

        reused = payload(await session.call_tool("remember", {**update, "key": "deploy.window"}))
        other = {**WINDOW, "key": "deploy.freeze", "value": "No deploys in December"}
        fresh = payload(await session.call_tool("remember", {**other, "new_key": True}))
        listed = payload(await session.call_tool("list_memories", {"kind": "fact"}))

    text = error_text(refused)
    assert text.startswith("Key choice required (409 key-choice-required): ")
    assert f'deploy.window ({window["id"]}): "Deploys run on Tuesdays"' in text
    assert "'new_key': true" in text
    assert refused.structured_content is not None
    assert refused.structured_content["keys"] == [
        {"key": "deploy.window", "id": window["id"], "value_start": "Deploys run on Tuesdays"}
    ]
    assert rest.status_code == 409
    assert refused.structured_content == {**rest.json(), "instance": "/mcp"}

    assert reused["superseded"] == [window["id"]]
    assert fresh["memory"]["key"] == "deploy.freeze"
    assert sorted((m["key"], m["value"]) for m in listed["items"]) == [
        ("deploy.freeze", "No deploys in December"),
        ("deploy.window", "Deploys run on Thursdays"),
    ]
