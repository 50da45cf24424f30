"""The version chain of a key stays linear and its times stay ordered: under concurrent
writers, with back-dated valid times, and when versions are deleted (red-team round 2; since
issue 12 a delete retracts in place, so numbers are never issued twice)."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any, cast

import httpx

from service.app import create_app
from tests.conftest import PUBLIC_URL
from tests.fixtures.api import Agent, Api
from tests.integration.memory.support import memory_rows

KEY = {"subject": "service:billing", "kind": "fact", "key": "deploy.window"}


def assert_linear(rows: list[dict[str, Any]]) -> None:
    """Oldest first: each version points at its neighbours, no pointer dangles, one live head."""
    ids = {row["id"] for row in rows}
    assert len({row["version"] for row in rows}) == len(rows), [r["version"] for r in rows]
    assert rows[0]["supersedes"] is None
    for older, newer in itertools.pairwise(rows):
        assert newer["supersedes"] == older["id"]
        assert older["superseded_by"] == newer["id"]
    assert all(row["superseded_by"] in ids | {None} for row in rows)
    assert [row["superseded_at"] is None for row in rows].count(True) <= 1


async def _concurrently(api: Api, agent: Agent, calls: list[tuple[str, str, Any]]) -> None:
    transport = httpx.ASGITransport(app=cast(Any, create_app(api.runtime)))
    async with httpx.AsyncClient(transport=transport, base_url=PUBLIC_URL) as client:
        responses = await asyncio.gather(
            *(
                client.request(method, path, json=body, headers=agent.headers)
                for method, path, body in calls
            )
        )
    assert all(r.status_code in {201, 204, 404} for r in responses), [r.text for r in responses]


async def test_concurrent_writers_keep_times_in_chain_order(api: Api) -> None:
    alice = await api.new_agent("alice")
    writes = [("POST", "/v1/memories", KEY | {"value": f"candidate {n}"}) for n in range(10)]
    await _concurrently(api, alice, writes)
    rows = await memory_rows(api.runtime, "key = 'deploy.window'")
    assert len(rows) == 10
    assert_linear(rows)
    for older, newer in itertools.pairwise(rows):
        assert older["recorded_at"] <= newer["recorded_at"]
        assert older["superseded_at"] == newer["recorded_at"]
        assert older["valid_until"] == newer["valid_from"]
        assert older["valid_from"] <= older["valid_until"]


async def test_back_dated_version_never_gives_a_negative_interval(api: Api) -> None:
    alice = await api.new_agent("alice")
    await api.remember(alice, **KEY, value="from 2030", valid_from="2030-01-01T00:00:00Z")
    await api.remember(alice, **KEY, value="from now")
    await api.remember(alice, **KEY, value="from 2020", valid_from="2020-01-01T00:00:00Z")
    rows = await memory_rows(api.runtime, "key = 'deploy.window'")
    assert_linear(rows)
    assert all(row["valid_from"] <= row["valid_until"] for row in rows[:-1])


async def test_deleting_the_head_leaves_no_live_value_and_the_next_write_continues(
    api: Api,
) -> None:
    alice = await api.new_agent("alice")
    versions = [await api.remember(alice, **KEY, value=f"value {n}") for n in range(3)]
    deleted = await api.http.delete(f"/v1/memories/{versions[2]['id']}", headers=alice.headers)
    assert deleted.status_code == 204
    listed = await api.http.get("/v1/memories", headers=alice.headers)
    assert listed.json()["items"] == []  # the old value does not come back
    previous = await api.http.get(f"/v1/memories/{versions[1]['id']}", headers=alice.headers)
    assert previous.json()["status"] == "superseded"
    assert previous.json()["superseded_by"] == versions[2]["id"]  # the stub stays in the chain
    after = await api.remember(alice, **KEY, value="after the delete")
    assert after["supersedes"] == versions[2]["id"]
    assert after["version"] == 4  # 3 was the deleted version's, and is never issued again
    assert_linear(await memory_rows(api.runtime, "key = 'deploy.window'"))


async def test_deleting_a_middle_version_keeps_its_place_in_the_chain(api: Api) -> None:
    alice = await api.new_agent("alice")
    versions = [await api.remember(alice, **KEY, value=f"value {n}") for n in range(3)]
    deleted = await api.http.delete(f"/v1/memories/{versions[1]['id']}", headers=alice.headers)
    assert deleted.status_code == 204
    first = await api.http.get(f"/v1/memories/{versions[0]['id']}", headers=alice.headers)
    assert first.json()["superseded_by"] == versions[1]["id"]
    head = await api.http.get(f"/v1/memories/{versions[2]['id']}", headers=alice.headers)
    assert head.json()["supersedes"] == versions[1]["id"]
    assert head.json()["status"] == "live"
    assert_linear(await memory_rows(api.runtime, "key = 'deploy.window'"))


async def test_writes_racing_deletes_keep_the_chain_linear(api: Api) -> None:
    alice = await api.new_agent("alice")
    for round_ in range(3):
        head = await api.remember(alice, **KEY, value=f"head {round_}")
        calls: list[tuple[str, str, Any]] = [("DELETE", f"/v1/memories/{head['id']}", None)]
        calls += [("POST", "/v1/memories", KEY | {"value": f"racer {n}"}) for n in range(4)]
        await _concurrently(api, alice, calls)
        assert_linear(await memory_rows(api.runtime, "key = 'deploy.window'"))
