"""Safe edits (issue 15): every memory answer carries its version's strong ETag, and `If-Match`
on a write, revert or delete changes the key only while the named version is its live one.
A stale precondition is 412 `precondition-failed` naming the current ETag, changes nothing, and
is audited as a failure; of two changes racing with the same ETag exactly one wins."""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy import text

from tests.fixtures.api import Agent, Api
from tests.integration.memory.support import as_owner, assert_problem, count_memories

WRITE = "/v1/memories"
KEY: dict[str, Any] = {
    "subject": "service:billing",
    "kind": "fact",
    "key": "deploy.window",
    "new_key": True,
}
LIVE_KEY = {"key": "deploy.window"}


def _if(agent: Agent, etag: str) -> dict[str, str]:
    return {**agent.headers, "If-Match": etag}


async def _live_value(api: Api, agent: Agent) -> list[str]:
    listed = await api.http.get(WRITE, params=LIVE_KEY, headers=agent.headers)
    assert listed.status_code == 200, listed.text
    return [item["value"] for item in listed.json()["items"]]


async def _failures(api: Api) -> list[tuple[str, int, str, str]]:
    async with as_owner(api.runtime) as conn:
        result = await conn.execute(
            text(
                "SELECT action, status, decision, reason FROM audit_events "
                "WHERE tenant_id = :t AND status = 412 ORDER BY seq"
            ),
            {"t": api.tenant_id},
        )
        return [(str(a), int(b), str(c), str(d)) for a, b, c, d in result.all()]


async def test_get_and_write_carry_the_versions_etag(api: Api) -> None:
    alice = await api.new_agent("alice")
    written = await api.http.post(WRITE, json={**KEY, "value": "tuesday"}, headers=alice.headers)
    assert written.status_code == 201, written.text
    memory = written.json()["memory"]
    assert memory["etag"] == f'"{memory["id"]}.1"'
    assert written.headers["etag"] == memory["etag"]
    read = await api.http.get(f"{WRITE}/{memory['id']}", headers=alice.headers)
    assert read.headers["etag"] == read.json()["etag"] == memory["etag"]
    history = await api.http.get(f"{WRITE}/{memory['id']}/history", headers=alice.headers)
    assert [item["etag"] for item in history.json()["items"]] == [memory["etag"]]


async def test_a_stale_if_match_is_412_changes_nothing_and_is_audited(api: Api) -> None:
    alice = await api.new_agent("alice")
    v1 = await api.remember(alice, **KEY, value="tuesday")
    v2 = await api.remember(alice, **KEY, value="friday")
    before = await count_memories(api.runtime)
    stale = v1["etag"]
    write = await api.http.post(WRITE, json={**KEY, "value": "monday"}, headers=_if(alice, stale))
    revert = await api.http.post(f"{WRITE}/{v1['id']}/revert", headers=_if(alice, stale))
    delete = await api.http.delete(f"{WRITE}/{v2['id']}", headers=_if(alice, stale))
    for refused in (write, revert, delete):
        problem = assert_problem(refused, 412, "precondition-failed")
        assert problem["current_etag"] == v2["etag"]
        assert v2["etag"] in problem["detail"]
    assert await count_memories(api.runtime) == before
    assert await _live_value(api, alice) == ["friday"]
    assert await _failures(api) == [
        ("memory.write", 412, "deny", "precondition-failed"),
        ("memory.revert", 412, "deny", "precondition-failed"),
        ("memory.delete", 412, "deny", "precondition-failed"),
    ]
    # The current ETag holds: each change goes through.
    now = await api.http.post(
        WRITE, json={**KEY, "value": "monday"}, headers=_if(alice, v2["etag"])
    )
    assert now.status_code == 201, now.text
    assert now.json()["superseded"] == [v2["id"]]
    v3 = now.json()["memory"]
    # A list of ETags holds when any is the live one; a weak one never does.
    reverted = await api.http.post(
        f"{WRITE}/{v1['id']}/revert", headers=_if(alice, f"{stale}, {v3['etag']}")
    )
    assert reverted.status_code == 201, reverted.text
    v4 = reverted.json()["memory"]
    weak = await api.http.delete(f"{WRITE}/{v4['id']}", headers=_if(alice, f"W/{v4['etag']}"))
    assert_problem(weak, 412, "precondition-failed")
    gone = await api.http.delete(f"{WRITE}/{v4['id']}", headers=_if(alice, v4["etag"]))
    assert gone.status_code == 204, gone.text
    assert await _live_value(api, alice) == []


async def test_if_match_star_asks_for_a_live_version(api: Api) -> None:
    alice = await api.new_agent("alice")
    new = await api.http.post(WRITE, json={**KEY, "value": "tuesday"}, headers=_if(alice, "*"))
    problem = assert_problem(new, 412, "precondition-failed")
    assert problem["current_etag"] is None
    assert await _live_value(api, alice) == []
    await api.remember(alice, **KEY, value="tuesday")
    update = await api.http.post(WRITE, json={**KEY, "value": "friday"}, headers=_if(alice, "*"))
    assert update.status_code == 201, update.text
    assert await _live_value(api, alice) == ["friday"]


async def test_a_malformed_if_match_is_422(api: Api) -> None:
    alice = await api.new_agent("alice")
    v1 = await api.remember(alice, **KEY, value="tuesday")
    for bad in ("no-quotes", '"a", b', ""):
        answer = await api.http.delete(f"{WRITE}/{v1['id']}", headers=_if(alice, bad))
        assert_problem(answer, 422, "invalid-request")
    assert await _live_value(api, alice) == ["tuesday"]


async def test_an_etag_of_another_memory_never_matches(api: Api) -> None:
    alice = await api.new_agent("alice")
    ours = await api.remember(alice, **KEY, value="tuesday")
    other = await api.remember(alice, **(KEY | {"key": "other.key"}), value="elsewhere")
    assert other["version"] == ours["version"] == 1
    answer = await api.http.post(
        WRITE, json={**KEY, "value": "friday"}, headers=_if(alice, other["etag"])
    )
    assert_problem(answer, 412, "precondition-failed")
    assert await _live_value(api, alice) == ["tuesday"]


async def _race(api: Api, requests: list[Any]) -> list[int]:
    answers = await asyncio.gather(*requests)
    return sorted(answer.status_code for answer in answers)


async def test_two_writes_racing_with_one_etag_exactly_one_wins(api: Api) -> None:
    alice = await api.new_agent("alice")
    v1 = await api.remember(alice, **KEY, value="tuesday")
    for round_ in range(3):
        live = (await api.http.get(WRITE, params=LIVE_KEY, headers=alice.headers)).json()
        etag = live["items"][0]["etag"]
        before = await count_memories(api.runtime)
        statuses = await _race(
            api,
            [
                api.http.post(
                    WRITE, json={**KEY, "value": f"{who} {round_}"}, headers=_if(alice, etag)
                )
                for who in ("a", "b")
            ],
        )
        assert statuses == [201, 412], statuses
        assert await count_memories(api.runtime) == before + 1
        assert len(await _live_value(api, alice)) == 1
    # A delete racing a write on the same ETag: one of them, never both.
    live = (await api.http.get(WRITE, params=LIVE_KEY, headers=alice.headers)).json()
    head = live["items"][0]
    statuses = await _race(
        api,
        [
            api.http.post(WRITE, json={**KEY, "value": "c"}, headers=_if(alice, head["etag"])),
            api.http.delete(f"{WRITE}/{head['id']}", headers=_if(alice, head["etag"])),
        ],
    )
    assert sorted(s for s in statuses if s != 412) in ([201], [204]), statuses
    assert statuses.count(412) == 1, statuses
    assert v1["id"]
