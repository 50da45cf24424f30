"""Expiry (ttl_seconds) and deletion (delete:memory, own space only)."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

from tests.fixtures.api import Agent, Api
from tests.integration.memory.support import (
    assert_problem,
    count_memories,
    memory_rows,
    random_id,
)


async def test_expired_memory_disappears_everywhere_at_once(api: Api) -> None:
    alice = await api.new_agent("alice")
    keeper = await api.remember(alice, key="keeper", value="the office plant needs water")
    brief = await api.remember(
        alice, key="deploy.lock", value="deploy lock held by alice", ttl_seconds=1
    )
    assert brief["status"] == "live"
    expires_at = datetime.fromisoformat(brief["expires_at"])
    recorded_at = datetime.fromisoformat(brief["provenance"]["recorded_at"])
    assert timedelta(0) < expires_at - recorded_at <= timedelta(seconds=2)

    got = await api.http.get(f"/v1/memories/{brief['id']}", headers=alice.headers)
    assert got.status_code == 200
    assert got.json()["id"] == brief["id"]
    listed = await api.http.get("/v1/memories", headers=alice.headers)
    assert {item["id"] for item in listed.json()["items"]} == {keeper["id"], brief["id"]}
    found = await api.search(alice, "deploy lock", k=10, min_score=0)
    assert brief["id"] in [hit["memory"]["id"] for hit in found.json()["hits"]]

    await asyncio.sleep(1.5)

    gone = await api.http.get(f"/v1/memories/{brief['id']}", headers=alice.headers)
    problem = assert_problem(gone, 404, "memory-not-found")
    fresh = random_id()
    never = await api.http.get(f"/v1/memories/{fresh}", headers=alice.headers)
    assert gone.content.replace(brief["id"].encode(), b"?") == never.content.replace(
        fresh.encode(), b"?"
    )
    assert "expire" not in problem["detail"].lower()
    listed = await api.http.get("/v1/memories", headers=alice.headers)
    assert [item["id"] for item in listed.json()["items"]] == [keeper["id"]]
    filtered = await api.http.get(
        "/v1/memories", params={"key": "deploy.lock"}, headers=alice.headers
    )
    assert filtered.json() == {"items": [], "next_cursor": None}
    found = await api.search(alice, "deploy lock held by alice", k=10, min_score=0)
    assert [hit["memory"]["id"] for hit in found.json()["hits"]] == [keeper["id"]]
    by_key = await api.search(
        alice, "deploy lock", k=10, filters={"key": "deploy.lock"}, min_score=0
    )
    assert by_key.json()["hits"] == []

    # The key is free again: the new write is live and the only visible version.
    again = await api.remember(alice, key="deploy.lock", value="deploy lock held by bob")
    assert again["status"] == "live"
    assert again["expires_at"] is None
    listed = await api.http.get(
        "/v1/memories", params={"key": "deploy.lock"}, headers=alice.headers
    )
    assert [item["id"] for item in listed.json()["items"]] == [again["id"]]
    found = await api.search(
        alice, "deploy lock", k=10, filters={"key": "deploy.lock"}, min_score=0
    )
    assert [hit["memory"]["id"] for hit in found.json()["hits"]] == [again["id"]]
    rows = await memory_rows(api.runtime, "key = 'deploy.lock'")
    assert len(rows) == 2
    assert [row["superseded_at"] is None for row in rows] == [False, True]


async def test_delete_needs_delete_scope(api: Api) -> None:
    writer = await api.new_agent("writer", scopes=("read:memory", "write:memory"))
    memory = await api.remember(writer, key="deploy.window", value="friday")
    response = await api.http.delete(f"/v1/memories/{memory['id']}", headers=writer.headers)
    problem = assert_problem(response, 403, "insufficient-scope")
    assert problem["required_scope"] == "delete:memory"
    # Asking the issuer for the scope does not help: it was never registered for this client.
    asked = await api.token_response(
        writer.client_id, writer.secret, "read:memory write:memory delete:memory"
    )
    assert asked.status_code == 200, asked.text
    assert "delete:memory" not in asked.json()["scope"].split()
    retry = await api.http.delete(
        f"/v1/memories/{memory['id']}",
        headers={"Authorization": f"Bearer {asked.json()['access_token']}"},
    )
    assert_problem(retry, 403, "insufficient-scope")
    still = await api.http.get(f"/v1/memories/{memory['id']}", headers=writer.headers)
    assert still.status_code == 200
    assert still.json()["status"] == "live"
    assert await count_memories(api.runtime) == 1


async def test_delete_removes_from_get_list_and_search(api: Api) -> None:
    alice = await api.new_agent("alice")
    doomed = await api.remember(alice, key="deploy.window", value="deploys happen on friday")
    kept = await api.remember(alice, key="oncall", value="alice is on call this week")
    response = await api.http.delete(f"/v1/memories/{doomed['id']}", headers=alice.headers)
    assert response.status_code == 204
    assert response.content == b""
    assert_problem(
        await api.http.get(f"/v1/memories/{doomed['id']}", headers=alice.headers),
        404,
        "memory-not-found",
    )
    listed = await api.http.get("/v1/memories", headers=alice.headers)
    assert [item["id"] for item in listed.json()["items"]] == [kept["id"]]
    found = await api.search(alice, "deploys happen on friday", k=10, min_score=0)
    assert [hit["memory"]["id"] for hit in found.json()["hits"]] == [kept["id"]]
    # Retracted, not removed: a content-free stub keeps the id and its number (issue 12).
    [stub] = await memory_rows(api.runtime, "id = :id", id=doomed["id"])
    assert stub["retracted_at"] is not None
    assert (stub["value"], stub["embedding"], stub["content_hash"]) == ("", None, b"")
    assert (stub["metadata"], stub["source"], stub["version"]) == ({}, None, 1)
    # Deleting twice is the same 404 as a random id.
    twice = await api.http.delete(f"/v1/memories/{doomed['id']}", headers=alice.headers)
    assert_problem(twice, 404, "memory-not-found")


async def test_delete_superseded_version_keeps_the_live_one(api: Api) -> None:
    alice = await api.new_agent("alice")
    old = await api.remember(alice, key="deploy.window", value="friday")
    new = await api.remember(alice, key="deploy.window", value="tuesday")
    response = await api.http.delete(f"/v1/memories/{old['id']}", headers=alice.headers)
    assert response.status_code == 204
    listed = await api.http.get("/v1/memories", headers=alice.headers)
    assert [item["id"] for item in listed.json()["items"]] == [new["id"]]
    assert await count_memories(api.runtime) == 2  # the old one is a retracted stub
    counted = await api.http.get("/v1/memories/counts", headers=alice.headers)
    assert counted.json()["total"] == 1


async def test_deleting_another_principals_memory_is_404_and_keeps_it(api: Api) -> None:
    alice = await api.new_agent("alice")
    bob = await api.new_agent("bob")
    bobs = await api.remember(bob, key="deploy.window", value="bob's deploy window is monday")
    response = await api.http.delete(f"/v1/memories/{bobs['id']}", headers=alice.headers)
    problem = assert_problem(response, 404, "memory-not-found")
    assert bobs["value"] not in response.text
    assert problem["detail"] == f"No memory {bobs['id']} is visible to you."

    still = await api.http.get(f"/v1/memories/{bobs['id']}", headers=bob.headers)
    assert still.status_code == 200
    assert still.json()["status"] == "live"
    assert still.json()["value"] == "bob's deploy window is monday"
    assert await count_memories(api.runtime) == 1
    found = await api.search(bob, "deploy window", k=5, min_score=0)
    assert [hit["memory"]["id"] for hit in found.json()["hits"]] == [bobs["id"]]


async def _shared_space(api: Api, grants: dict[str, tuple[str, ...]]) -> str:
    """A tenant space with these grants per principal id (`read`, `write`, `delete`)."""
    created = await api.http.post("/v1/spaces", json={"name": "ops"}, headers=api.admin.headers)
    assert created.status_code == 201, created.text
    space_id: str = created.json()["space"]["id"]
    for principal_id, actions in grants.items():
        for action in actions:
            granted = await api.http.put(
                f"/v1/spaces/{space_id}/grants/{action}/user:{principal_id}",
                headers=api.admin.headers,
            )
            assert granted.status_code == 200, granted.text
    return space_id


async def _three_versions(api: Api, writer: Agent, space_id: str) -> list[dict[str, Any]]:
    return [
        await api.remember(writer, space_id=space_id, key="deploy.window", value=day)
        for day in ("monday", "tuesday", "friday")
    ]


async def _links(api: Api, space_id: str) -> list[tuple[Any, Any, Any]]:
    rows = await memory_rows(api.runtime, "space_id = :s", s=space_id)
    return [(row["id"], row["supersedes"], row["superseded_by"]) for row in rows]


async def test_delete_without_write_retracts_and_keeps_the_chain(api: Api) -> None:
    """A delete retracts the version in place (issue 12): nothing is re-linked, so read +
    delete is enough whatever the neighbours (before, it needed write for the splice and
    answered 403 `delete-needs-write`), and the chain's links are exactly as they were."""
    alice = await api.new_agent("alice")
    janitor = await api.new_agent("janitor")
    space_id = await _shared_space(
        api, {alice.principal_id: ("read", "write"), janitor.principal_id: ("read", "delete")}
    )
    first, middle, head = await _three_versions(api, alice, space_id)
    before = await _links(api, space_id)
    response = await api.http.delete(f"/v1/memories/{middle['id']}", headers=janitor.headers)
    assert response.status_code == 204
    assert await _links(api, space_id) == before
    [stub] = await memory_rows(api.runtime, "id = :id", id=middle["id"])
    assert (stub["value"], stub["retracted_at"] is not None) == ("", True)
    walked = await api.http.get(f"/v1/memories/{first['id']}", headers=janitor.headers)
    assert walked.json()["superseded_by"] == middle["id"]
    # The deleter could not write: row-level security let it make a retraction only.
    kept = await api.http.get(f"/v1/memories/{head['id']}", headers=janitor.headers)
    assert (kept.json()["value"], kept.json()["status"]) == ("friday", "live")


async def test_delete_with_write_keeps_the_stub_between_its_neighbours(api: Api) -> None:
    """The middle version stays as a stub; its neighbours still point at it (no splice)."""
    alice = await api.new_agent("alice")
    janitor = await api.new_agent("janitor")
    space_id = await _shared_space(
        api,
        {
            alice.principal_id: ("read", "write"),
            janitor.principal_id: ("read", "write", "delete"),
        },
    )
    first, middle, head = await _three_versions(api, alice, space_id)
    response = await api.http.delete(f"/v1/memories/{middle['id']}", headers=janitor.headers)
    assert response.status_code == 204
    links = {
        str(a): (str(b) if b else None, str(c) if c else None)
        for a, b, c in await _links(api, space_id)
    }
    assert links[first["id"]] == (None, middle["id"])
    assert links[middle["id"]] == (first["id"], head["id"])
    assert links[head["id"]] == (middle["id"], None)
