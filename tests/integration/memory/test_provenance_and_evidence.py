"""Provenance on every get and hit, the narrowed-audience note on a write, and the evidence
gate (issue 12)."""

from __future__ import annotations

import uuid
from typing import Any

import httpx

from tests.fixtures.api import Agent, Api
from tests.integration.memory.support import assert_problem
from tests.integration.memory.test_write_gate import _shared_space

PROVENANCE = {
    "writer_id",
    "client_id",
    "act",
    "source",
    "recorded_at",
    "superseded_at",
    "derived_from",
    "derived_from_withheld",
    "read_requires",
    "embedding_model",
}


async def _get(api: Api, agent: Agent, memory_id: str) -> dict[str, Any]:
    response = await api.http.get(f"/v1/memories/{memory_id}", headers=agent.headers)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def _hit(api: Api, agent: Agent, query: str, memory_id: str) -> dict[str, Any]:
    found = await api.search(agent, query, k=20)
    assert found.status_code == 200, found.text
    [memory] = [h["memory"] for h in found.json()["hits"] if h["memory"]["id"] == memory_id]
    hit: dict[str, Any] = memory
    return hit


async def _personal_space(api: Api, agent: Agent) -> str:
    mine = await api.remember(agent, subject="s:probe", key="probe", value="where am I")
    space: str = mine["space_id"]
    return space


async def test_every_get_and_hit_carries_its_provenance(api: Api) -> None:
    alice = await api.new_agent("alice")
    first = await api.remember(alice, key="deploy.window", value="Tuesdays", source="runbook")
    second = await api.remember(alice, key="deploy.window", value="Thursdays", source="chat")
    old, new = await _get(api, alice, first["id"]), await _get(api, alice, second["id"])
    for memory in (old, new, await _hit(api, alice, "Thursdays", second["id"])):
        assert set(memory["provenance"]) == PROVENANCE
        assert memory["provenance"]["writer_id"] == alice.principal_id
        assert memory["provenance"]["client_id"] == alice.client_id
        assert memory["provenance"]["act"] is None
        assert memory["provenance"]["read_requires"] == []
    assert (old["status"], new["status"]) == ("superseded", "live")
    assert (old["superseded_by"], new["supersedes"]) == (second["id"], first["id"])
    assert old["valid_until"] == new["valid_from"]
    assert old["provenance"]["superseded_at"] == new["provenance"]["recorded_at"]
    assert new["provenance"]["superseded_at"] is None
    assert (old["provenance"]["source"], new["provenance"]["source"]) == ("runbook", "chat")


async def test_a_summary_from_a_private_note_says_its_audience_narrowed(api: Api) -> None:
    alice, bob = await api.new_agent("alice"), await api.new_agent("bob")
    team = await _shared_space(api, alice, bob)
    personal = await _personal_space(api, alice)
    note = await api.remember(alice, key="invoice.private", value="alice's private note")
    fact = await api.remember(alice, key="invoice.team", value="team invoice fact", space_id=team)

    narrowed = await api.http.post(
        "/v1/memories",
        json={
            "subject": "service:billing",
            "kind": "summary",
            "key": "invoice.summary",
            "value": "summary of invoices",
            "space_id": team,
            "derived_from": [note["id"], fact["id"]],
        },
        headers=alice.headers,
    )
    assert narrowed.status_code == 201, narrowed.text
    written = narrowed.json()
    note_on_audience = written["audience_narrowed"]
    assert note_on_audience["required_spaces"] == [personal]
    assert note_on_audience["writer_only"] is True
    assert "nobody but you" in note_on_audience["detail"]
    assert written["memory"]["provenance"]["read_requires"] == sorted([personal, team])
    # And it is so: Bob, who reads the team space, does not see it.
    hidden = await api.http.get(f"/v1/memories/{written['memory']['id']}", headers=bob.headers)
    assert_problem(hidden, 404, "memory-not-found")

    # Derived from the team's own fact only: nothing narrowed, nothing said.
    plain = await api.http.post(
        "/v1/memories",
        json={
            "subject": "service:billing",
            "kind": "summary",
            "key": "invoice.team-summary",
            "value": "team summary",
            "space_id": team,
            "derived_from": [fact["id"]],
            "new_key": True,
        },
        headers=bob.headers,
    )
    assert plain.status_code == 201, plain.text
    assert plain.json()["audience_narrowed"] is None
    assert plain.json()["memory"]["provenance"]["read_requires"] == [team]


async def test_sources_you_can_no_longer_read_are_withheld_not_named(api: Api) -> None:
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
    assert summary["provenance"]["derived_from"] == [note["id"], kept["id"]]
    deleted = await api.http.delete(f"/v1/memories/{note['id']}", headers=alice.headers)
    assert deleted.status_code == 204, deleted.text

    got = await _get(api, alice, summary["id"])
    hit = await _hit(api, alice, "invoice summary", summary["id"])
    listed = await api.http.get("/v1/memories", params={"kind": "summary"}, headers=alice.headers)
    [item] = listed.json()["items"]
    for memory in (got, hit, item):
        assert memory["provenance"]["derived_from"] == [kept["id"]]
        assert memory["provenance"]["derived_from_withheld"] == 1
        assert note["id"] not in str(memory)


async def _evidence_space(api: Api, *members: Agent) -> str:
    team = await _shared_space(api, *members, name="decisions")
    on = await api.http.put(
        f"/v1/spaces/{team}/settings", json={"evidence_gate": True}, headers=api.admin.headers
    )
    assert on.status_code == 200, on.text
    assert on.json()["settings"] == {"write_gate": True, "evidence_gate": True}
    return team


def _decision(space: str, **fields: Any) -> dict[str, Any]:
    return {
        "subject": "service:billing",
        "kind": "decision",
        "key": "deploy.policy",
        "value": "We deploy on Thursdays",
        "space_id": space,
    } | fields


async def _count(api: Api, agent: Agent) -> int:
    counted = await api.http.get("/v1/memories/counts", headers=agent.headers)
    total: int = counted.json()["total"]
    return total


async def test_the_evidence_gate_wants_readable_sources(api: Api) -> None:
    alice, bob = await api.new_agent("alice"), await api.new_agent("bob")
    team = await _evidence_space(api, alice)
    before = await _count(api, alice)

    async def post(body: dict[str, Any]) -> httpx.Response:
        answer: httpx.Response = await api.http.post(
            "/v1/memories", json=body, headers=alice.headers
        )
        return answer

    for kind in ("decision", "summary"):
        refused = await post(_decision(team, kind=kind))
        body = assert_problem(refused, 422, "evidence-required")
        assert "derived_from" in body["detail"]
        assert body["space_id"] == team
    # A source Alice cannot read answers exactly like one that does not exist.
    bobs = await api.remember(bob, key="bob.note", value="bob's private reasoning")
    invisible = await post(_decision(team, derived_from=[bobs["id"]]))
    made_up_id = str(uuid.uuid4())
    missing = await post(_decision(team, derived_from=[made_up_id]))
    assert_problem(invisible, 404, "memory-not-found")
    assert invisible.json() == {
        **missing.json(),
        "detail": missing.json()["detail"].replace(made_up_id, bobs["id"]),
    }
    assert await _count(api, alice) == before  # nothing was written

    # Cited and readable: written. Other kinds need no sources; other spaces have no gate.
    evidence = await api.remember(alice, key="deploy.log", value="Thursday deploys failed less",
                                  space_id=team, kind="episode")  # fmt: skip
    cited = await post(_decision(team, derived_from=[evidence["id"]]))
    assert cited.status_code == 201, cited.text
    assert cited.json()["memory"]["provenance"]["derived_from"] == [evidence["id"]]
    assert (await post(_decision(team, kind="fact", key="deploy.day"))).status_code == 201
    personal = await api.http.post(
        "/v1/memories",
        json={"subject": "s:x", "kind": "decision", "key": "k", "value": "no sources needed"},
        headers=alice.headers,
    )
    assert personal.status_code == 201, personal.text
