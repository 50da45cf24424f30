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
    # Its own space narrows nothing, so it is not listed (rt12: listing it forked the chain).
    assert written["memory"]["provenance"]["read_requires"] == [personal]
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
    assert plain.json()["memory"]["provenance"]["read_requires"] == []


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


async def _grant(api: Api, space_id: str, action: str, agent: Agent) -> None:
    granted = await api.http.put(
        f"/v1/spaces/{space_id}/grants/{action}/user:{agent.principal_id}",
        headers=api.admin.headers,
    )
    assert granted.status_code == 200, granted.text


async def _summary_with_a_deleted_source(
    api: Api, alice: Agent
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """A summary of two notes, the first of them deleted since: (note, kept, summary)."""
    note = await api.remember(alice, key="note.a", value="first source about invoices")
    kept = await api.remember(alice, key="note.b", value="second source about invoices")
    summary = await api.remember(
        alice,
        kind="summary",
        key="invoices",
        value="invoice summary",
        derived_from=[note["id"], kept["id"]],
    )
    deleted = await api.http.delete(f"/v1/memories/{note['id']}", headers=alice.headers)
    assert deleted.status_code == 204, deleted.text
    return note, kept, summary


async def test_history_withholds_the_sources_get_withholds(api: Api) -> None:
    """Red-team (rt12 A): history built its items without the check get, list and search
    make, naming a deleted source's id. It answers like GET; a stub cites nothing."""
    alice = await api.new_agent("alice")
    note, kept, summary = await _summary_with_a_deleted_source(api, alice)
    got = await _get(api, alice, summary["id"])
    history = await api.http.get(f"/v1/memories/{summary['id']}/history", headers=alice.headers)
    assert history.status_code == 200, history.text
    [item] = history.json()["items"]
    assert item["provenance"] == got["provenance"]
    assert item["provenance"]["derived_from"] == [kept["id"]]
    assert item["provenance"]["derived_from_withheld"] == 1
    assert note["id"] not in history.text
    # Deleted, the summary's version is a stub in its history: it cites nothing at all.
    gone = await api.http.delete(f"/v1/memories/{summary['id']}", headers=alice.headers)
    assert gone.status_code == 204, gone.text
    history = await api.http.get(f"/v1/memories/{summary['id']}/history", headers=alice.headers)
    [stub] = history.json()["items"]
    assert stub["status"] == "retracted"
    assert (stub["provenance"]["derived_from"], stub["provenance"]["derived_from_withheld"]) == (
        [],
        0,
    )
    assert kept["id"] not in history.text
    assert note["id"] not in history.text


async def test_revert_keeps_the_sources_you_can_read_and_says_it_dropped_one(api: Api) -> None:
    """Red-team (rt12 A): revert copied `derived_from` as it was, so a version citing a
    source deleted since could never be reverted, and the 404 named the withheld id. Revert
    cites the sources still readable and says how many it dropped."""
    alice = await api.new_agent("alice")
    note, kept, summary = await _summary_with_a_deleted_source(api, alice)
    reverted = await api.http.post(f"/v1/memories/{summary['id']}/revert", headers=alice.headers)
    assert reverted.status_code == 201, reverted.text
    assert note["id"] not in reverted.text
    written = reverted.json()
    again = written["memory"]
    assert (again["value"], again["version"], written["superseded"]) == (
        "invoice summary",
        2,
        [summary["id"]],
    )
    assert again["provenance"]["derived_from"] == [kept["id"]]
    assert again["provenance"]["derived_from_withheld"] == 0
    note_on_revert = written["reverted"]
    assert note_on_revert["sources_dropped"] == 1
    assert again["provenance"]["read_requires"] == summary["provenance"]["read_requires"] == []
    assert "1 of the sources of version 1" in note_on_revert["detail"]
    # A revert citing everything it had says nothing more.
    plain = await api.http.post(f"/v1/memories/{kept['id']}/revert", headers=alice.headers)
    assert plain.status_code == 201, plain.text
    assert plain.json()["reverted"] is None


async def test_a_revert_without_a_source_keeps_the_audience_it_narrowed(api: Api) -> None:
    """The source dropped from a revert narrowed the version's audience: the value was
    derived from it, so the new version keeps that audience (it must not reach the team)."""
    alice, bob = await api.new_agent("alice"), await api.new_agent("bob")
    team = await _shared_space(api, alice, bob)
    private = await _shared_space(api, bob, name="bob-only")
    secret = await api.remember(bob, key="k.secret", value="the private reason", space_id=private)
    fact = await api.remember(bob, key="k.fact", value="the team fact", space_id=team)
    summary = await api.remember(
        bob,
        kind="summary",
        key="k.summary",
        value="summary for the team",
        space_id=team,
        derived_from=[secret["id"], fact["id"]],
    )
    assert summary["provenance"]["read_requires"] == [private]
    await _grant(api, private, "delete", bob)
    gone = await api.http.delete(f"/v1/memories/{secret['id']}", headers=bob.headers)
    assert gone.status_code == 204, gone.text
    reverted = await api.http.post(f"/v1/memories/{summary['id']}/revert", headers=bob.headers)
    assert reverted.status_code == 201, reverted.text
    assert secret["id"] not in reverted.text
    again = reverted.json()["memory"]
    assert again["provenance"]["derived_from"] == [fact["id"]]
    assert again["provenance"]["read_requires"] == [private]
    assert reverted.json()["reverted"]["sources_dropped"] == 1
    hidden = await api.http.get(f"/v1/memories/{again['id']}", headers=alice.headers)
    assert_problem(hidden, 404, "memory-not-found")


async def test_revert_with_no_readable_source_left_meets_the_evidence_gate(api: Api) -> None:
    """A decision whose only source was deleted cannot come back in a space that wants
    evidence: a problem that says what to do, naming no source, and nothing written."""
    alice = await api.new_agent("alice")
    team = await _evidence_space(api, alice)
    evidence = await api.remember(alice, key="deploy.log", value="Thursday deploys failed less",
                                  space_id=team, kind="episode")  # fmt: skip
    decided = await api.http.post(
        "/v1/memories",
        json=_decision(team, derived_from=[evidence["id"]]),
        headers=alice.headers,
    )
    assert decided.status_code == 201, decided.text
    decision = decided.json()["memory"]
    await _grant(api, team, "delete", alice)
    gone = await api.http.delete(f"/v1/memories/{evidence['id']}", headers=alice.headers)
    assert gone.status_code == 204, gone.text
    before = await _count(api, alice)
    refused = await api.http.post(f"/v1/memories/{decision['id']}/revert", headers=alice.headers)
    body = assert_problem(refused, 422, "evidence-required")
    assert "none of the sources" in body["detail"]
    assert "derived_from" in body["detail"]
    assert evidence["id"] not in refused.text
    assert await _count(api, alice) == before


async def _evidence_space(api: Api, *members: Agent) -> str:
    team = await _shared_space(api, *members, name="decisions")
    on = await api.http.put(
        f"/v1/spaces/{team}/settings", json={"evidence_gate": True}, headers=api.admin.headers
    )
    assert on.status_code == 200, on.text
    assert on.json()["settings"] == {
        "write_gate": True,
        "evidence_gate": True,
        "max_unused_days": None,
        "consolidation": {"with_spaces": [], "excluded_sources": ["external:"]},
        "review": False,
    }
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
