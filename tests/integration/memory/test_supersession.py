"""Supersession: the same (space, subject, kind, key) written again replaces the live version,
keeps the old one readable by id with its links, and never reaches into another space."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from datetime import datetime
from typing import Any, cast

import httpx

from service.app import create_app
from tests.conftest import PUBLIC_URL
from tests.fixtures.api import Agent, Api
from tests.integration.memory.support import memory_rows


async def _get(api: Api, agent: Agent, memory_id: str) -> dict[str, Any]:
    response = await api.http.get(f"/v1/memories/{memory_id}", headers=agent.headers)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def _listed(api: Api, agent: Agent, **params: str) -> list[str]:
    response = await api.http.get("/v1/memories", params=params, headers=agent.headers)
    assert response.status_code == 200, response.text
    return [item["id"] for item in response.json()["items"]]


async def _found(api: Api, agent: Agent, query: str, **fields: Any) -> list[str]:
    response = await api.search(agent, query, k=50, **({"min_score": 0} | fields))
    assert response.status_code == 200, response.text
    return [hit["memory"]["id"] for hit in response.json()["hits"]]


async def test_second_write_supersedes_the_first(api: Api) -> None:
    alice = await api.new_agent("alice")
    first = await api.remember(alice, key="deploy.window", value="deploys happen on friday")
    assert (first["status"], first["version"], first["supersedes"]) == ("live", 1, None)
    assert first["valid_until"] is None
    assert first["superseded_by"] is None

    response = await api.http.post(
        "/v1/memories",
        json={
            "subject": "service:billing",
            "kind": "fact",
            "key": "deploy.window",
            "value": "deploys happen on tuesday",
        },
        headers=alice.headers,
    )
    assert response.status_code == 201, response.text
    written = response.json()
    second = written["memory"]
    assert written["superseded"] == [first["id"]]
    assert second["status"] == "live"
    assert second["supersedes"] == first["id"]
    assert second["superseded_by"] is None
    assert second["version"] == 2
    assert second["value"] == "deploys happen on tuesday"

    old = await _get(api, alice, first["id"])
    assert old["status"] == "superseded"
    assert old["superseded_by"] == second["id"]
    assert old["valid_until"] is not None
    assert datetime.fromisoformat(old["valid_until"]) >= datetime.fromisoformat(old["valid_from"])
    assert old["value"] == "deploys happen on friday"
    assert old["version"] == 1
    assert await _get(api, alice, second["id"]) == second | {"status": "live"}

    assert await _listed(api, alice) == [second["id"]]
    assert await _listed(api, alice, key="deploy.window") == [second["id"]]
    assert await _found(api, alice, "deploys happen on friday") == [second["id"]]

    rows = await memory_rows(api.runtime, "key = :key", key="deploy.window")
    assert [(str(r["id"]), r["version"]) for r in rows] == [(first["id"], 1), (second["id"], 2)]
    assert rows[0]["superseded_at"] is not None
    assert rows[1]["superseded_at"] is None


async def test_different_key_or_kind_does_not_supersede(api: Api) -> None:
    alice = await api.new_agent("alice")
    base = await api.remember(alice, kind="fact", key="deploy.window", value="friday")
    other_key = await api.remember(alice, kind="fact", key="deploy.freeze", value="december")
    other_kind = await api.remember(alice, kind="decision", key="deploy.window", value="tuesday")
    other_subject = await api.remember(
        alice, subject="service:search", kind="fact", key="deploy.window", value="monday"
    )
    ids = [base["id"], other_key["id"], other_kind["id"], other_subject["id"]]
    for memory_id in ids:
        memory = await _get(api, alice, memory_id)
        assert memory["status"] == "live"
        assert memory["version"] == 1
        assert memory["supersedes"] is None
        assert memory["superseded_by"] is None
    assert sorted(await _listed(api, alice)) == sorted(ids)
    assert sorted(await _found(api, alice, "deploy")) == sorted(ids)


async def test_two_principals_same_key_do_not_supersede_each_other(api: Api) -> None:
    alice = await api.new_agent("alice")
    bob = await api.new_agent("bob")
    mine = await api.remember(alice, key="deploy.window", value="alice says friday")
    theirs = await api.remember(bob, key="deploy.window", value="bob says tuesday")
    assert mine["space_id"] != theirs["space_id"]
    assert theirs["version"] == 1
    assert theirs["supersedes"] is None

    assert (await _get(api, alice, mine["id"]))["status"] == "live"
    assert (await _get(api, bob, theirs["id"]))["status"] == "live"
    assert await _listed(api, alice) == [mine["id"]]
    assert await _listed(api, bob) == [theirs["id"]]
    assert await _found(api, alice, "who says what") == [mine["id"]]
    assert await _found(api, bob, "who says what") == [theirs["id"]]
    rows = await memory_rows(api.runtime, "key = 'deploy.window'")
    assert len(rows) == 2
    assert all(row["superseded_at"] is None for row in rows)


async def test_concurrent_writes_leave_one_live_row_and_a_linear_chain(api: Api) -> None:
    alice = await api.new_agent("alice")
    # The Litestar test client serializes requests through a blocking portal; an ASGI transport
    # on this event loop lets the five writes really overlap.
    app = create_app(api.runtime)
    transport = httpx.ASGITransport(app=cast(Any, app))
    async with httpx.AsyncClient(transport=transport, base_url=PUBLIC_URL) as client:
        responses = await asyncio.gather(
            *(
                client.post(
                    "/v1/memories",
                    json={
                        "subject": "service:billing",
                        "kind": "fact",
                        "key": "deploy.window",
                        "value": f"deploy window candidate {n}",
                    },
                    headers=alice.headers,
                )
                for n in range(5)
            )
        )
    assert [r.status_code for r in responses] == [201] * 5, [r.text for r in responses]
    written = [r.json() for r in responses]
    ids = {w["memory"]["id"] for w in written}
    assert len(ids) == 5

    rows = await memory_rows(api.runtime, "key = 'deploy.window'")
    assert len(rows) == 5
    live = [row for row in rows if row["superseded_at"] is None]
    assert len(live) == 1
    assert [row["version"] for row in rows] == [1, 2, 3, 4, 5]
    assert rows[0]["supersedes"] is None
    for older, newer in itertools.pairwise(rows):
        assert newer["supersedes"] == older["id"]
        assert older["superseded_by"] == newer["id"]
        assert older["valid_until"] is not None
    assert rows[-1]["superseded_by"] is None
    assert rows[-1]["id"] == live[0]["id"]

    # Each write reported exactly the version it closed.
    by_id = {str(row["id"]): row for row in rows}
    for w in written:
        row = by_id[w["memory"]["id"]]
        expected = [] if row["supersedes"] is None else [str(row["supersedes"])]
        assert w["superseded"] == expected
        assert w["memory"]["version"] == row["version"]

    live_id = str(live[0]["id"])
    assert await _listed(api, alice) == [live_id]
    assert await _found(api, alice, "deploy window") == [live_id]
    for memory_id in ids - {live_id}:
        old = await _get(api, alice, memory_id)
        assert old["status"] == "superseded"
        assert old["superseded_by"] == str(by_id[memory_id]["superseded_by"])
    assert uuid.UUID(live_id).version == 7
