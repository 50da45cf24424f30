"""The write gate (issue 12): a key new to its subject, while the subject has live memories of
the same kind under other keys that the writer can read, answers 409 `key-choice-required`
listing them; reusing one supersedes it, `new_key: true` writes a new key. Keys the writer
cannot read are never named and never count. Two writers racing with different new keys for
one subject cannot both pass. A space's `write_gate` setting turns it off."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncSession

from service.auth.principal import Principal
from service.calls import Call, Facts
from service.memory.problems import KeyChoiceRequired
from service.memory.schemas import MemoryCreate
from service.memory.service import MemoryService, first_words
from tests.fixtures.api import Agent, Api
from tests.integration.memory.support import assert_problem

SUBJECT = "service:billing"
CONSOLIDATION = {"with_spaces": [], "excluded_sources": ["external:"]}
"""A space's consolidation policy by default (issue 13: docs/jobs.md)."""


def _body(**fields: Any) -> dict[str, Any]:
    return {"subject": SUBJECT, "kind": "fact", "key": "k", "value": "v"} | fields


async def _write(api: Api, agent: Agent, **fields: Any) -> httpx.Response:
    response: httpx.Response = await api.http.post(
        "/v1/memories", json=_body(**fields), headers=agent.headers
    )
    return response


async def _live(api: Api, agent: Agent, **params: str) -> list[dict[str, Any]]:
    listed = await api.http.get("/v1/memories", params=params, headers=agent.headers)
    assert listed.status_code == 200, listed.text
    items: list[dict[str, Any]] = listed.json()["items"]
    return items


async def _shared_space(api: Api, *members: Agent, name: str = "billing-team") -> str:
    """A team space every member reads and writes."""
    admin = api.admin.headers
    team = (await api.http.post("/v1/teams", json={"name": name}, headers=admin)).json()
    created = await api.http.post("/v1/spaces", json={"name": name}, headers=admin)
    space_id: str = created.json()["space"]["id"]
    for action in ("read", "write"):
        granted = await api.http.put(
            f"/v1/spaces/{space_id}/grants/{action}/{team['subject']}", headers=admin
        )
        assert granted.status_code == 200, granted.text
    for member in members:
        added = await api.http.put(
            f"/v1/teams/{team['id']}/members/{member.principal_id}", headers=admin
        )
        assert added.status_code == 200, added.text
    return space_id


async def test_a_new_key_for_a_known_subject_answers_409_with_its_keys(api: Api) -> None:
    alice = await api.new_agent("alice")
    window = await _write(
        api, alice, key="deploy.window", value="Deploys run on Tuesdays 10-12 UTC"
    )
    assert window.status_code == 201, window.text  # the subject's first key passes
    window_id = window.json()["memory"]["id"]

    refused = await _write(api, alice, key="deploy.slot", value="Deploys run on Thursdays")
    body = assert_problem(refused, 409, "key-choice-required")
    assert body["keys"] == [
        {
            "key": "deploy.window",
            "id": window_id,
            "value_start": "Deploys run on Tuesdays 10-12 UTC",
        }
    ]
    assert (body["subject"], body["kind"], body["more_keys"]) == (SUBJECT, "fact", False)
    assert "deploy.window" in body["detail"]
    assert "new_key" in body["detail"]
    # Nothing was written.
    assert [m["key"] for m in await _live(api, alice)] == ["deploy.window"]

    # Reusing the offered key supersedes it; the same key again is never gated.
    reused = await _write(api, alice, key="deploy.window", value="Deploys run on Thursdays")
    assert reused.status_code == 201, reused.text
    assert reused.json()["superseded"] == [window_id]
    # new_key: true writes a second key of the subject.
    fresh = await _write(api, alice, key="deploy.freeze", value="No deploys in December",
                         new_key=True)  # fmt: skip
    assert fresh.status_code == 201, fresh.text
    live = await _live(api, alice)
    assert sorted((m["key"], m["value"]) for m in live) == [
        ("deploy.freeze", "No deploys in December"),
        ("deploy.window", "Deploys run on Thursdays"),
    ]
    # Now two keys are offered, in key order.
    again = assert_problem(await _write(api, alice, key="deploy.days"), 409, "key-choice-required")
    assert [k["key"] for k in again["keys"]] == ["deploy.freeze", "deploy.window"]


async def test_only_the_same_subject_kind_and_space_count(api: Api) -> None:
    """ "Same subject" is an exact match; other kinds, subjects and spaces are other chains."""
    alice = await api.new_agent("alice")
    team = await _shared_space(api, alice)
    assert (await _write(api, alice, key="deploy.window")).status_code == 201
    for other in (
        {"kind": "preference", "key": "deploy.style"},
        {"subject": "service:billing-eu", "key": "deploy.slot"},
        {"subject": "Service:billing", "key": "deploy.slot"},
        {"space_id": team, "key": "deploy.slot"},
    ):
        written = await _write(api, alice, **other)
        assert written.status_code == 201, (other, written.text)


async def test_the_gate_never_names_or_counts_a_key_the_writer_cannot_read(api: Api) -> None:
    alice, bob, carol = [await api.new_agent(n) for n in ("alice", "bob", "carol")]
    team = await _shared_space(api, alice, bob, carol)
    # Bob's memories of the subject that Alice cannot read: in his personal space, and in the
    # team space with an audience narrowed to his personal space (derived from a private note).
    private = await api.remember(bob, key="bob.private", value="Bob's private billing note")
    await api.remember(bob, key="bob.personal", value="billing secret in bob's space")
    narrowed = await _write(api, bob, key="bob.narrowed", value="derived from bob's note",
                            space_id=team, derived_from=[private["id"]])  # fmt: skip
    assert narrowed.status_code == 201, narrowed.text

    # Nothing Alice can read: her new key passes, and the answer names nothing of Bob's.
    passed = await _write(api, alice, key="alice.first", value="Alice's fact", space_id=team)
    assert passed.status_code == 201, passed.text
    assert "bob" not in passed.text.lower()

    # With a key Alice can read (Carol's, in the team space), the 409 lists that one only.
    carols = await api.remember(carol, key="carol.visible", value="Carol's shared fact",
                                space_id=team)  # fmt: skip
    refused = await _write(api, alice, key="alice.second", space_id=team)
    body = assert_problem(refused, 409, "key-choice-required")
    assert {k["key"] for k in body["keys"]} == {"alice.first", "carol.visible"}
    assert carols["id"] in {k["id"] for k in body["keys"]}
    assert "bob" not in refused.text.lower()
    assert narrowed.json()["memory"]["id"] not in refused.text


async def test_a_source_of_the_memorys_own_space_supersedes_in_its_chain(api: Api) -> None:
    """Red-team (rt12 E): a source's space went into `read_requires` even when it was the
    memory's own, so citing a note of the same space made another audience, hence another
    chain: the old value stayed live beside the new one, and version 1 was issued again. It
    narrows nothing, so it is not listed and the new value supersedes the old."""
    alice = await api.new_agent("alice")
    team = await _shared_space(api, alice)
    note = await api.remember(alice, subject="service:other", key="note",
                              value="ticket 42 says thursday", space_id=team)  # fmt: skip
    v1 = await api.remember(alice, subject=SUBJECT, key="deploy.window",
                            value="deploys on tuesday", space_id=team)  # fmt: skip
    cited = await _write(api, alice, key="deploy.window", value="deploys on thursday",
                         space_id=team, derived_from=[note["id"]])  # fmt: skip
    assert cited.status_code == 201, cited.text
    written = cited.json()
    assert written["superseded"] == [v1["id"]]
    assert written["audience_narrowed"] is None
    memory = written["memory"]
    assert (memory["version"], memory["supersedes"]) == (2, v1["id"])
    assert memory["provenance"]["read_requires"] == []
    assert memory["provenance"]["derived_from"] == [note["id"]]
    live = await _live(api, alice, subject=SUBJECT, key="deploy.window")
    assert [(m["value"], m["version"]) for m in live] == [("deploys on thursday", 2)]


async def test_a_source_of_the_memorys_own_space_does_not_bypass_the_gate(api: Api) -> None:
    """Red-team (rt12 E): the same new key was refused plain and written when it cited a
    note of the same space (another audience, so no other key counted). Both are gated."""
    alice = await api.new_agent("alice")
    team = await _shared_space(api, alice)
    note = await api.remember(alice, subject="service:other", key="note", value="ticket 42",
                              space_id=team)  # fmt: skip
    old = await api.remember(alice, subject=SUBJECT, key="deploy.window",
                             value="deploys on tuesday", space_id=team)  # fmt: skip
    new = {"key": "deploy.day", "value": "deploys on thursday", "space_id": team}
    plain = await _write(api, alice, **new)
    cited = await _write(api, alice, **new, derived_from=[note["id"]])
    for refused in (plain, cited):
        body = assert_problem(refused, 409, "key-choice-required")
        assert [(k["key"], k["id"]) for k in body["keys"]] == [("deploy.window", old["id"])]
    assert [m["key"] for m in await _live(api, alice, subject=SUBJECT)] == ["deploy.window"]


async def test_first_words_cut_long_values() -> None:
    long = " ".join(f"word{i}" for i in range(40))
    assert first_words(long) == " ".join(f"word{i}" for i in range(12)) + " …"
    assert first_words("short value") == "short value"
    assert len(first_words("x" * 500)) <= 122


async def test_a_space_can_turn_the_gate_off(api: Api) -> None:
    alice = await api.new_agent("alice")
    team = await _shared_space(api, alice)
    assert (await _write(api, alice, key="a", space_id=team)).status_code == 201
    assert_problem(await _write(api, alice, key="b", space_id=team), 409, "key-choice-required")

    off = await api.http.put(
        f"/v1/spaces/{team}/settings", json={"write_gate": False}, headers=api.admin.headers
    )
    assert off.status_code == 200, off.text
    assert off.json() == {
        "space_id": team,
        "settings": {
            "write_gate": False,
            "evidence_gate": False,
            "max_unused_days": None,
            "consolidation": CONSOLIDATION,
            "review": False,
        },
    }
    assert (await _write(api, alice, key="b", space_id=team)).status_code == 201
    # Only that space: Alice's personal space still gates.
    assert (await _write(api, alice, key="p1")).status_code == 201
    assert_problem(await _write(api, alice, key="p2"), 409, "key-choice-required")
    # The spaces listing shows each space's settings, defaults filled in.
    listed = await api.http.get("/v1/spaces", headers=api.admin.headers)
    settings = {s["id"]: s["settings"] for s in listed.json()["items"]}
    assert settings[team] == {
        "write_gate": False,
        "evidence_gate": False,
        "max_unused_days": None,
        "consolidation": CONSOLIDATION,
        "review": False,
    }
    assert {
        "write_gate": True,
        "evidence_gate": False,
        "max_unused_days": None,
        "consolidation": CONSOLIDATION,
        "review": False,
    } in settings.values()

    # Back on (a field left out takes its default).
    on = await api.http.put(f"/v1/spaces/{team}/settings", json={}, headers=api.admin.headers)
    assert on.json()["settings"] == {
        "write_gate": True,
        "evidence_gate": False,
        "max_unused_days": None,
        "consolidation": CONSOLIDATION,
        "review": False,
    }
    assert_problem(await _write(api, alice, key="c", space_id=team), 409, "key-choice-required")


async def test_space_settings_refuse_bad_input_and_change_nothing(api: Api) -> None:
    alice = await api.new_agent("alice")
    team = await _shared_space(api, alice)
    path, admin = f"/v1/spaces/{team}/settings", api.admin.headers
    refusals: list[dict[str, Any]] = [
        {"write_gates": False},
        {"write_gate": "no"},
        {"evidence_gate": 1},
        {"max_unused_days": 0},
        {"max_unused_days": 36_501},
        {"max_unused_days": "30"},
        {"consolidation": {"with_space": []}},
        {"consolidation": {"excluded_sources": [""]}},
        {"consolidation": {"excluded_sources": "external:"}},
        {"consolidation": {"with_spaces": [str(uuid.uuid4()) for _ in range(17)]}},
    ]
    for bad in refusals:
        refused = await api.http.put(path, json=bad, headers=admin)
        body = assert_problem(refused, 422, "invalid-request")
        assert body["errors"], body
    not_an_id = {"consolidation": {"with_spaces": ["nope"]}}
    body = assert_problem(
        await api.http.put(path, json=not_an_id, headers=admin), 400, "malformed-id"
    )
    assert body["errors"][0]["field"] == "consolidation.with_spaces[0]"
    missing = await api.http.put(f"/v1/spaces/{uuid.uuid4()}/settings", json={}, headers=admin)
    assert_problem(missing, 404, "space-unknown")
    # Still the defaults: the gate holds.
    assert (await _write(api, alice, key="a", space_id=team)).status_code == 201
    assert_problem(await _write(api, alice, key="b", space_id=team), 409, "key-choice-required")


async def test_space_settings_need_a_token_the_scope_and_the_policy_admin_grant(
    api: Api,
) -> None:
    alice = await api.new_agent("alice")
    team = await _shared_space(api, alice)
    path = f"/v1/spaces/{team}/settings"
    off = {"write_gate": False}
    assert_problem(await api.http.put(path, json=off), 401, "unauthenticated")
    assert_problem(
        await api.http.put(path, json=off, headers=alice.headers), 403, "insufficient-scope"
    )
    other = await api.other_tenant()
    foreign = await other.http.put(path, json=off, headers=other.admin.headers)
    made_up = await other.http.put(
        f"/v1/spaces/{uuid.uuid4()}/settings", json=off, headers=other.admin.headers
    )
    assert_problem(foreign, 404, "space-unknown")
    assert foreign.json()["detail"] == f"No space {team} in your tenant."
    assert made_up.status_code == 404
    same = {"detail": None, "instance": None}
    assert {**made_up.json(), **same} == {**foreign.json(), **same}
    # Refused every time: the gate is still on.
    assert (await _write(api, alice, key="a", space_id=team)).status_code == 201
    assert_problem(await _write(api, alice, key="b", space_id=team), 409, "key-choice-required")


def _principal(api: Api, agent: Agent) -> Principal:
    return Principal(
        tenant_id=uuid.UUID(api.tenant_id),
        principal_id=uuid.UUID(agent.principal_id),
        client_id=agent.client_id,
        scopes=frozenset({"read:memory", "write:memory"}),
        token_id="test",
        issuer="test",
    )


def _racer(api: Api, agent: Agent) -> tuple[MemoryService, Principal, AsyncSession]:
    """A memory service on a call of its own (its own connection and transaction)."""
    caller = _principal(api, agent)
    session = Call(api.runtime, "memory.write", "POST", "/v1/memories", caller=caller).db
    limits = api.runtime.settings.memory
    return MemoryService(session, api.runtime.embedder, limits, facts=Facts()), caller, session


def _fact(key: str, value: str, space: str) -> MemoryCreate:
    return MemoryCreate(
        subject=SUBJECT, kind="fact", key=key, value=value, space_id=uuid.UUID(space)
    )


async def test_two_writers_of_different_new_keys_cannot_both_pass(api: Api) -> None:
    """Two real calls, each in its own transaction: the first writes `deploy.window` and holds
    its transaction open; the second, writing `deploy.slot` for the same subject, waits on the
    subject lock instead of passing a gate that cannot see the first's uncommitted key. Once
    the first commits, the second is refused with the first's key."""
    alice, bob = await api.new_agent("alice"), await api.new_agent("bob")
    team = await _shared_space(api, alice, bob)
    first, alice_caller, first_db = _racer(api, alice)
    second, bob_caller, second_db = _racer(api, bob)
    try:
        written = await first.write(alice_caller, _fact("deploy.window", "Tuesdays", team))
        racing = asyncio.create_task(
            second.write(bob_caller, _fact("deploy.slot", "Thursdays", team))
        )
        await asyncio.sleep(1.0)
        assert not racing.done(), "the second writer passed the gate while the first was open"
        await first_db.commit()
        with pytest.raises(KeyChoiceRequired) as refused:
            await asyncio.wait_for(racing, 10)
        assert refused.value.extensions["keys"] == [
            {"key": "deploy.window", "id": str(written.memory.id), "value_start": "Tuesdays"}
        ]
    finally:
        for session in (first_db, second_db):
            await session.rollback()
            await session.close()
    assert [m["key"] for m in await _live(api, alice, space_id=team)] == ["deploy.window"]


async def test_concurrent_http_writers_of_new_keys_leave_one_key(api: Api) -> None:
    """The same race through the API: of several writers of different new keys for one
    subject, sent at once, exactly one is written and every other is refused naming it."""
    agents = [await api.new_agent(f"writer{i}") for i in range(4)]
    team = await _shared_space(api, *agents)
    answers = await asyncio.gather(
        *(
            _write(api, agent, key=f"deploy.key{i}", value=f"value {i}", space_id=team)
            for i, agent in enumerate(agents)
        )
    )
    statuses = sorted(answer.status_code for answer in answers)
    assert statuses == [201, 409, 409, 409], [a.text for a in answers]
    [winner] = [a.json()["memory"] for a in answers if a.status_code == 201]
    for refused in (a for a in answers if a.status_code == 409):
        assert [k["id"] for k in refused.json()["keys"]] == [winner["id"]]
    assert [m["id"] for m in await _live(api, agents[0], space_id=team)] == [winner["id"]]


async def test_a_subject_with_many_keys_lists_twenty_and_says_there_are_more(api: Api) -> None:
    alice = await api.new_agent("alice")
    for i in range(21):
        await api.remember(alice, key=f"fact.{i:02d}", value=f"fact number {i}")
    refused = await _write(api, alice, key="fact.new")
    body = assert_problem(refused, 409, "key-choice-required")
    assert [k["key"] for k in body["keys"]] == [f"fact.{i:02d}" for i in range(20)]
    assert body["more_keys"] is True
    assert "and more" in body["detail"]
