"""Erasing a person everywhere: plan (subject, owner, versions, derived, mention review),
execute, receipt and proof, against the real migrations, policy and files."""

from __future__ import annotations

import json
from typing import Any

import httpx

from service.audit.checkpoints import verify_signature
from tests.fixtures.api import Api
from tests.fixtures.canaries import captured_logs
from tests.integration.erasure.support import (
    CANARIES,
    MENTION,
    NAME,
    Person,
    assert_no_canary,
    filed_person,
    make_eraser,
    plan,
)
from tests.integration.memory.support import as_owner, assert_problem, scalar


async def test_a_person_is_erased_everywhere_and_the_proof_says_so(api: Api) -> None:
    await make_eraser(api)
    with captured_logs() as logs:
        person = await filed_person(api)
        planned = await plan(api, person)
        assert planned.status_code == 201, planned.text
        body = planned.json()
        ids = person.ids

        by_owner = {row["id"] for row in body["by_owner"]}
        assert {ids["note"], ids["team"], ids["first"], ids["second"]} <= by_owner | {
            row["id"] for row in body["versions"]
        }
        assert {row["id"] for row in body["by_subject"]} == {ids["preference"]}
        assert {row["id"] for row in body["derived"]} == {person.summary_id}
        assert [row["id"] for row in body["review"]] == [ids["mention"]]
        assert {row["space_id"] for row in body["review"]} == {person.team}
        assert body["names"] == 1
        assert NAME not in planned.text
        assert (body["counts"]["derived"], body["counts"]["review"]) == (1, 1)

        executed = await api.http.post(
            f"/v1/erasures/{body['id']}/execute",
            json={"version": body["version"]},
            headers=api.admin.headers,
        )
        assert executed.status_code == 200, executed.text
        receipt = executed.json()
        proof = await api.http.get(f"/v1/erasures/{body['id']}/proof", headers=api.admin.headers)
        assert proof.status_code == 200, proof.text

    # The receipt: signed with the audit checkpoint key, content-free.
    keys = await api.http.get("/v1/audit/keys", headers=api.admin.headers)
    claims = verify_signature(receipt["receipt"], keys.json())
    assert claims is not None
    assert claims == receipt["claims"]
    assert claims["counts"]["memories"] == 6
    assert claims["counts"]["pseudonym_mappings"] >= 1
    assert sorted(claims["erased"]) == sorted([*(ids[key] for key in CANARIES), person.summary_id])
    assert person.alice.principal_id not in json.dumps(claims["criteria"])
    assert NAME not in executed.text
    assert "Alice" not in executed.text
    assert_no_canary(executed.text, "the receipt")

    # The proof: nothing left, the files scanned before and after.
    evidence = proof.json()
    assert (evidence["rows_left"], evidence["vectors_left"]) == (0, 0)
    assert (evidence["owned_left"], evidence["dangling_references"]) == (0, 0)
    facts = evidence["evidence"]
    assert facts["finalized"] is True
    assert facts["mentions_left"] == 1
    assert all(table == "ok" for table in facts["vacuum"]["tables"].values()), facts["vacuum"]
    values = facts["needles"]["values"]
    assert values == len(CANARIES) + 1  # her five texts and the summary
    assert facts["needles"] == {
        "values": values,
        "total": values,
        "truncated": False,
        "observable": values,
    }
    assert facts["files_before"]["scanned"] is True
    assert facts["files_before"]["complete"] is True
    assert all(found > 0 for found in facts["files_before"]["found"])
    assert facts["files_after"]["found"] == [0] * values, facts["files_after"]
    assert "memories" in facts["files_before"]["relations"]
    assert [near["needle"] for near in facts["nearest"]] == list(range(1, values + 1))
    assert all(-1 <= near["similarity"] <= 1 for near in facts["nearest"])
    assert all(set(near) == {"needle", "similarity"} for near in facts["nearest"])
    assert_no_canary(proof.text, "the proof")

    # No read surface, stored row, pseudonym mapping, audit row or log line has her texts.
    for reader in (person.bob, api.admin, person.alice):
        found = await api.search(reader, "canary reorg runbook deploy window standups")
        assert found.status_code == 200, found.text
        assert_no_canary(found.text, "a search")
    for key in CANARIES:
        gone = await api.http.get(f"/v1/memories/{ids[key]}", headers=person.alice.headers)
        assert_problem(gone, 404, "memory-not-found")
    kept = await api.http.get(f"/v1/memories/{ids['mention']}", headers=person.bob.headers)
    assert kept.json()["value"] == MENTION
    async with as_owner(api.runtime) as conn:
        from sqlalchemy import text

        dump = await conn.execute(
            text("SELECT row_to_json(m)::text FROM memories m WHERE tenant_id = :t"),
            {"t": api.tenant_id},
        )
        assert_no_canary("\n".join(row[0] for row in dump), "the memories table")
        audit = await conn.execute(
            text("SELECT row_to_json(a)::text FROM audit_events a WHERE tenant_id = :t"),
            {"t": api.tenant_id},
        )
        assert_no_canary("\n".join(row[0] for row in audit), "the audit log")
        plans = await conn.execute(text("SELECT row_to_json(p)::text FROM erasure_plans p"))
        rendered = "\n".join(row[0] for row in plans)
        assert NAME not in rendered
        assert_no_canary(rendered, "the erasure plans")
        # The subjects are kept as their audit pseudonyms only, the names not at all.
        criteria = (
            await conn.execute(text("SELECT subjects, names, name_count FROM erasure_plans"))
        ).one()
        assert f"user:{person.alice.principal_id}" not in criteria.subjects
        assert (len(criteria.subjects), criteria.names, criteria.name_count) == (1, [], 1)
        # No owner id either: it would resolve the receipt's owner pseudonym (finding 7).
        owners = (await conn.execute(text("SELECT owners FROM erasure_plans"))).scalar_one()
        assert owners == []
    mappings = await scalar(
        api.runtime,
        "SELECT count(*) FROM audit_actors WHERE principal_id = :p",
        p=person.alice.principal_id,
    )
    assert mappings == 0
    assert_no_canary(repr(logs), "the logs")

    # The tombstone: the same text is not learned again where it was erased (the team space);
    # elsewhere a write tells nothing of what was erased (red team, finding 5).
    again = await _team_text_again(api, person, new_key=True)
    assert_problem(again, 409, "content-erased")
    # Refused twice over (a new key past the write gate, and the tombstone): one problem, the
    # gate's first, not a 500 (the single-write path unpacked exactly one refusal).
    gated = await _team_text_again(api, person)
    assert_problem(gated, 409, "key-choice-required")
    elsewhere = await api.remember(person.bob, subject="service:x", value=CANARIES["team"])
    assert elsewhere["value"] == CANARIES["team"]


async def _team_text_again(api: Api, person: Person, **fields: Any) -> httpx.Response:
    """Bob writes her erased team fact into the team space again."""
    body = {
        "subject": "service:search",
        "kind": "fact",
        "key": "again",
        "value": CANARIES["team"],
        "space_id": person.team,
    }
    response: httpx.Response = await api.http.post(
        "/v1/memories", json=body | fields, headers=person.bob.headers
    )
    return response
