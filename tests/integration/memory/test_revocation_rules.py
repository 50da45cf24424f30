"""Revocation's rules one by one: who may revoke, the reason that quotes, born-hidden writes
and `409 content-revoked`, causes counted per revocation, reinstating only the revoked memory,
a copy coming back into a key that is live, audit rows without the reason, and search never
under-filled by hidden near-duplicates (promise 3)."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import psycopg
import pytest

from service.revocation.repository import lock_name
from tests.fixtures.api import Agent, Api
from tests.integration.jobs.consolidation_support import team_space
from tests.integration.memory.revocation_support import post, reinstate, revoke, surfaces
from tests.integration.memory.support import (
    assert_problem,
    memory_rows,
    random_id,
    scalar,
)

POLICY = "Refunds above 200 EUR need a second signature"


async def _write(api: Api, agent: Agent, **fields: Any) -> Any:
    body = {"subject": "policy:refunds", "kind": "fact", "key": "refund", "value": POLICY}
    response = await post(api, agent, "/v1/memories", body | {"new_key": True} | fields)
    assert response.status_code == 201, response.text
    return response.json()


async def _get(api: Api, agent: Agent, memory_id: str) -> int:
    response = await api.http.get(f"/v1/memories/{memory_id}", headers=agent.headers)
    return response.status_code


async def test_revoke_needs_delete_scope_and_grant(api: Api) -> None:
    alice = await api.new_agent("alice")
    writer = await api.new_agent("writer", scopes=("read:memory", "write:memory"))
    reader = await api.new_agent("reader", scopes=("read:memory", "delete:memory"))
    team = await team_space(api, "refunds", alice)
    granted = await api.http.put(
        f"/v1/spaces/{team}/grants/read/user:{reader.principal_id}", headers=api.admin.headers
    )
    assert granted.status_code == 200, granted.text
    memory = (await _write(api, alice, space_id=team))["memory"]
    body = {"reason": "withdrawn"}
    path = f"/v1/memories/{memory['id']}/revoke"

    anonymous = await api.http.post(path, json=body)
    assert anonymous.status_code == 401
    no_scope = await post(api, writer, path, body)
    assert_problem(no_scope, 403, "insufficient-scope")
    # Scope but no delete grant on the space: the memory is not there for this caller.
    no_grant = await post(api, reader, path, body)
    assert_problem(no_grant, 404, "memory-not-found")
    unknown = await post(api, alice, f"/v1/memories/{random_id()}/revoke", body)
    assert_problem(unknown, 404, "memory-not-found")
    assert await _get(api, reader, memory["id"]) == 200
    assert await scalar(api.runtime, "SELECT count(*) FROM revocations") == 0


async def test_a_reason_that_quotes_the_content_is_refused_and_changes_nothing(api: Api) -> None:
    alice = await api.new_agent("alice")
    memory = (await _write(api, alice))["memory"]
    for reason in (
        "no longer true: above 200 EUR",
        "the rule 'REFUNDS  above\u200b 200' is gone",
        "need a second signature? not anymore",
        "old rule: refunds_above_200_EUR_need_a_second_signature",
    ):
        refused = await post(api, alice, f"/v1/memories/{memory['id']}/revoke", {"reason": reason})
        problem = assert_problem(refused, 422, "reason-quotes-content")
        assert "consecutive words" in problem["detail"]
    assert await _get(api, alice, memory["id"]) == 200
    assert await scalar(api.runtime, "SELECT count(*) FROM revocations") == 0
    # Two words in a row are not a quote.
    await revoke(api, alice, memory["id"], "refunds changed: see finance wiki, 200 is old")
    assert await _get(api, alice, memory["id"]) == 404


async def test_a_reason_that_quotes_a_short_value_whole_is_refused(api: Api) -> None:
    alice = await api.new_agent("alice")
    memory = (await _write(api, alice, key="refund.approver", value="Ask Mallory."))["memory"]
    refused = await post(
        api, alice, f"/v1/memories/{memory['id']}/revoke", {"reason": "wrong: ask_mallory"}
    )
    problem = assert_problem(refused, 422, "reason-quotes-content")
    assert "shorter" in problem["detail"]
    assert await scalar(api.runtime, "SELECT count(*) FROM revocations") == 0
    await revoke(api, alice, memory["id"], "the approver changed, see the finance wiki")


async def test_audit_rows_name_ids_and_never_the_reason(api: Api) -> None:
    alice = await api.new_agent("alice")
    memory = (await _write(api, alice))["memory"]
    derived = (
        await _write(api, alice, key="refund.note", value="ok", derived_from=[memory["id"]])
    )["memory"]
    reason = "withdrawn-by-cfo-xyzzy"
    await revoke(api, alice, memory["id"], reason)
    await reinstate(api, alice, memory["id"], "restored-by-cfo-plugh")
    rows = await memory_rows(api.runtime)
    assert len(rows) == 2
    audit = await scalar(
        api.runtime,
        "SELECT json_agg(json_build_object('action', action, 'targets', target_ids, "
        "'count', result_count, 'reason', reason) ORDER BY seq) FROM audit_events "
        "WHERE action IN ('memory.revoke', 'memory.reinstate')",
    )
    assert [row["action"] for row in audit] == ["memory.revoke", "memory.reinstate"]
    for row in audit:
        assert set(row["targets"]) == {memory["id"], derived["id"]}
        assert row["count"] == 2
    assert "xyzzy" not in str(audit)
    assert "plugh" not in str(audit)
    stored = await scalar(api.runtime, "SELECT reason || '|' || reinstate_reason FROM revocations")
    assert stored == f"{reason}|restored-by-cfo-plugh"


async def test_rewrites_are_born_hidden_or_refused_when_asked(api: Api) -> None:
    alice = await api.new_agent("alice")
    memory = (await _write(api, alice))["memory"]
    await revoke(api, alice, memory["id"])
    before = len(await memory_rows(api.runtime))
    refused = await post(
        api,
        alice,
        "/v1/memories",
        {
            "subject": "policy:refunds",
            "kind": "fact",
            "key": "refund.again",
            "value": "  refunds ABOVE 200 eur need a second\u2060 signature ",
            "new_key": True,
            "on_revoked": "reject",
        },
    )
    problem = assert_problem(refused, 409, "content-revoked")
    assert problem["because"] == "content-revoked"
    derived = await post(
        api,
        alice,
        "/v1/memories",
        {
            "subject": "policy:refunds",
            "kind": "decision",
            "key": "refund.case",
            "value": "case 12 refunded with one signature",
            "derived_from": [memory["id"]],
            "new_key": True,
            "on_revoked": "reject",
        },
    )
    assert assert_problem(derived, 409, "content-revoked")["because"] == "derived-from-hidden"
    assert len(await memory_rows(api.runtime)) == before
    # A batch: every covered item listed, nothing written.
    batch = await post(
        api,
        alice,
        "/v1/memories:batch",
        {
            "items": [
                {"subject": "s:a", "kind": "fact", "key": "a", "value": "fine", "new_key": True},
                {
                    "subject": "s:b",
                    "kind": "fact",
                    "key": "b",
                    "value": POLICY.upper(),
                    "on_revoked": "reject",
                },
            ]
        },
    )
    rejected = assert_problem(batch, 422, "batch-rejected")
    assert [(e["index"], e["type"].rsplit("/", 1)[1]) for e in rejected["errors"]] == [
        (1, "content-revoked")
    ]
    # By default: stored hidden, outside the key's chain, closing nothing.
    live = (await _write(api, alice, key="refund.v2", value="Refunds need one signature"))["memory"]
    copy = await _write(api, alice, key="refund.v2", value=POLICY + "\ufe0f")
    assert copy["memory"]["status"] == "hidden"
    assert copy["superseded"] == []
    assert await _get(api, alice, copy["memory"]["id"]) == 404
    assert await _get(api, alice, live["id"]) == 200
    # Other spaces are not covered: the revocation is of a claim in its space.
    team = await team_space(api, "other", alice)
    elsewhere = await _write(api, alice, space_id=team)
    assert elsewhere["memory"]["status"] == "live"
    assert elsewhere.get("hidden") is None


async def test_a_row_hidden_by_two_revocations_needs_both_reinstated(api: Api) -> None:
    alice = await api.new_agent("alice")
    one = (await _write(api, alice, key="a", value="the refund desk closes at five"))["memory"]
    two = (await _write(api, alice, key="b", value="the refund desk opens at nine"))["memory"]
    both = (
        await _write(
            api,
            alice,
            key="c",
            value="desk hours: nine to five",
            derived_from=[one["id"], two["id"]],
        )
    )["memory"]
    grand = (
        await _write(api, alice, key="d", value="call before five", derived_from=[both["id"]])
    )["memory"]
    assert (await revoke(api, alice, one["id"]))["hidden"] == 3
    assert (await revoke(api, alice, two["id"]))["hidden"] == 3
    assert (await reinstate(api, alice, one["id"]))["restored"] == 1
    assert [await _get(api, alice, m["id"]) for m in (one, two, both, grand)] == [
        200,
        404,
        404,
        404,
    ]
    assert (await reinstate(api, alice, two["id"]))["restored"] == 3
    assert [await _get(api, alice, m["id"]) for m in (one, two, both, grand)] == [200] * 4


async def test_only_the_revoked_memory_can_be_reinstated(api: Api) -> None:
    alice = await api.new_agent("alice")
    memory = (await _write(api, alice))["memory"]
    derived = (
        await _write(api, alice, key="refund.case", value="ok", derived_from=[memory["id"]])
    )["memory"]
    await revoke(api, alice, memory["id"])
    copy = (await _write(api, alice, key="refund.copy"))["memory"]
    for hidden in (copy, derived):
        refused = await post(
            api, alice, f"/v1/memories/{hidden['id']}/reinstate", {"reason": "please"}
        )
        problem = assert_problem(refused, 409, "not-the-revoked-memory")
        assert problem["reinstate"] == [memory["id"]]
        assert memory["id"] in problem["detail"]
        again = await post(api, alice, f"/v1/memories/{hidden['id']}/revoke", {"reason": "x"})
        assert assert_problem(again, 409, "memory-already-hidden")["revoked_memory_ids"] == [
            memory["id"]
        ]
    twice = await post(api, alice, f"/v1/memories/{memory['id']}/revoke", {"reason": "x"})
    assert_problem(twice, 409, "memory-already-hidden")
    other = (await _write(api, alice, key="other", value="unrelated"))["memory"]
    not_revoked = await post(api, alice, f"/v1/memories/{other['id']}/reinstate", {"reason": "x"})
    assert_problem(not_revoked, 409, "memory-not-revoked")
    quoting = await post(
        api,
        alice,
        f"/v1/memories/{memory['id']}/reinstate",
        {"reason": "back: need a second signature"},
    )
    assert_problem(quoting, 422, "reason-quotes-content")
    assert (await reinstate(api, alice, memory["id"]))["restored"] == 3
    assert [await _get(api, alice, m["id"]) for m in (memory, copy, derived)] == [200] * 3


async def test_a_copy_coming_back_into_a_live_key_is_closed_by_it(api: Api) -> None:
    alice = await api.new_agent("alice")
    memory = (await _write(api, alice, key="refund"))["memory"]
    await revoke(api, alice, memory["id"])
    replacement = (await _write(api, alice, key="refund", value="Refunds need one signature"))[
        "memory"
    ]
    copy = (await _write(api, alice, key="refund"))["memory"]
    await reinstate(api, alice, memory["id"])
    listed = await api.http.get("/v1/memories", params={"key": "refund"}, headers=alice.headers)
    assert [i["id"] for i in listed.json()["items"]] == [replacement["id"]]
    rows = {str(r["id"]): r for r in await memory_rows(api.runtime)}
    assert str(rows[memory["id"]]["superseded_by"]) == replacement["id"]
    assert str(rows[copy["id"]]["superseded_by"]) == replacement["id"]


@pytest.mark.bypasses_visible("plays a revoke by hand: writes the revocation row as the owner")
async def test_a_write_waits_for_a_revocation_in_flight(api: Api) -> None:
    """A write reads which revocations cover it only once no revoke of its tenant is in
    flight (the revocation lock, shared by writers): a revoke holding it keeps the write
    waiting, and the write then reads what that revoke committed."""
    alice = await api.new_agent("alice")
    memory = (await _write(api, alice, key="warm", value="first write of the tenant"))["memory"]
    name = lock_name(uuid.UUID(api.tenant_id))
    held, release = threading.Event(), threading.Event()

    def revoke_in_flight() -> None:
        # What a revoke does, by hand, from another connection: the lock, then the revocation.
        with psycopg.connect(api.runtime.settings.database.url) as conn:
            conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (name,))
            held.set()
            release.wait(timeout=30)
            conn.execute(
                "INSERT INTO revocations (tenant_id, id, memory_id, space_id, content_hash, "
                "reason, revoked_by) SELECT tenant_id, gen_random_uuid(), id, space_id, "
                "content_hash, 'test', owner_id FROM memories WHERE id = %s",
                (memory["id"],),
            )
            conn.commit()

    holder = threading.Thread(target=revoke_in_flight)
    holder.start()
    assert held.wait(timeout=30)
    threading.Timer(1.5, release.set).start()
    started = time.monotonic()
    written = await _write(api, alice, key="during", value="first write of the tenant")
    waited = time.monotonic() - started
    holder.join(timeout=30)
    assert waited >= 1.4, "the write did not wait for the revocation lock"
    # It read the revocation committed while it waited: stored hidden.
    assert written["memory"]["status"] == "hidden"


async def test_revoke_and_reinstate_honour_if_match(api: Api) -> None:
    """Their If-Match names the memory itself: another version's ETag is 412 naming the
    memory's, and changes nothing; its own (or `*`) goes ahead."""
    alice = await api.new_agent("alice")
    first = (await _write(api, alice))["memory"]
    second = (await _write(api, alice, value="Refunds need one signature", new_key=False))["memory"]
    revoke_path = f"/v1/memories/{second['id']}/revoke"
    body = {"reason": "withdrawn"}
    stale = await api.http.post(
        revoke_path, json=body, headers=alice.headers | {"If-Match": first["etag"]}
    )
    assert_problem(stale, 412, "precondition-failed")
    assert stale.json()["current_etag"] == second["etag"]
    assert await scalar(api.runtime, "SELECT count(*) FROM revocations") == 0
    assert await _get(api, alice, second["id"]) == 200
    revoked = await api.http.post(
        revoke_path, json=body, headers=alice.headers | {"If-Match": second["etag"]}
    )
    assert revoked.status_code == 200, revoked.text

    reinstate_path = f"/v1/memories/{second['id']}/reinstate"
    stale = await api.http.post(
        reinstate_path, json=body, headers=alice.headers | {"If-Match": first["etag"]}
    )
    assert_problem(stale, 412, "precondition-failed")
    assert await _get(api, alice, second["id"]) == 404
    back = await api.http.post(reinstate_path, json=body, headers=alice.headers | {"If-Match": "*"})
    assert back.status_code == 200, back.text
    assert await _get(api, alice, second["id"]) == 200


SECRET = "Layoffs planned for March in the Berlin office"
DERIVED = "Berlin office headcount cut in March is confirmed"


async def test_a_revoked_text_the_writer_cannot_read_is_still_hidden_and_tells_one_bit(
    api: Api,
) -> None:
    """The residual disclosure docs/security-model.md names (finding 6 of issue 15): a writer
    who writes, into a space it writes, the exact (normalized) text of a memory revoked there
    whose audience it lacks still gets its copy stored hidden (promise 7: the text reaches no
    reader), so its answer says `hidden` / 409 `content-revoked`: one bit, "a memory revoked in
    this space has this text". The answer names no memory id, audience or reason, and the
    copy reaches no reader, its writer included."""
    alice = await api.new_agent("alice")
    bob = await api.new_agent("bob")
    team = await team_space(api, "berlin", alice, bob)
    secret = await team_space(api, "hr-secret", alice)
    source = (await _write(api, alice, space_id=secret, key="plan", value=SECRET))["memory"]
    derived = (
        await _write(
            api, alice, space_id=team, key="headcount", value=DERIVED, derived_from=[source["id"]]
        )
    )["memory"]
    assert derived["provenance"]["read_requires"]  # its audience: hr-secret's readers
    assert await _get(api, bob, derived["id"]) == 404
    await revoke(api, alice, derived["id"], "premature, withdrawn by HR")

    body = {"subject": "rumours", "kind": "fact", "space_id": team, "new_key": True}
    refused = await post(
        api,
        bob,
        "/v1/memories",
        body | {"key": "r1", "value": DERIVED.upper(), "on_revoked": "reject"},
    )
    problem = assert_problem(refused, 409, "content-revoked")
    stored = await post(api, bob, "/v1/memories", body | {"key": "r2", "value": DERIVED.upper()})
    assert stored.status_code == 201, stored.text
    assert stored.json()["memory"]["status"] == "hidden"
    assert stored.json()["hidden"]["because"] == "content-revoked"
    control = await post(api, bob, "/v1/memories", body | {"key": "r3", "value": "Munich grows"})
    assert control.json()["memory"]["status"] == "live"
    for answer in (refused.text, stored.text):
        for withheld in (derived["id"], source["id"], secret, "premature", "withdrawn by HR"):
            assert withheld not in answer
    assert set(problem) >= {"because", "space_id"}
    copy_id = stored.json()["memory"]["id"]
    assert await _get(api, bob, copy_id) == 404
    assert await _get(api, alice, copy_id) == 404


async def test_a_revoked_memory_can_be_deleted_without_reinstating(api: Api) -> None:
    """DELETE reaches a revoked row: its content leaves storage while it stays hidden, nothing
    it hid comes back, and the revocation still stands (a re-write is born hidden). The
    deleted memory cannot be reinstated any more (404: a stub holds nothing to bring back)."""
    alice = await api.new_agent("alice")
    memory_id = (await _write(api, alice))["memory"]["id"]
    copy_id = (await _write(api, alice, key="refund.copy"))["memory"]["id"]
    await revoke(api, alice, memory_id, "withdrawn by finance")

    deleted = await api.http.delete(f"/v1/memories/{memory_id}", headers=alice.headers)
    assert deleted.status_code == 204, deleted.text

    (row,) = await memory_rows(api.runtime, "id = :id", id=uuid.UUID(memory_id))
    assert row["value"] == ""
    assert bytes(row["content_hash"]) == b""
    assert row["embedding"] is None
    assert row["retracted_at"] is not None
    (copy,) = await memory_rows(api.runtime, "id = :id", id=uuid.UUID(copy_id))
    assert copy["value"] == POLICY  # a copy is not deleted with it; it stays hidden
    hidden = await scalar(
        api.runtime,
        "SELECT count(*) FROM memories WHERE id IN (:a, :b) AND revoked_at IS NOT NULL",
        a=uuid.UUID(memory_id),
        b=uuid.UUID(copy_id),
    )
    assert hidden == 2
    seen = await surfaces(api, alice, "refunds second signature", [memory_id, copy_id])
    assert seen == {name: set() for name in seen}
    assert await _get(api, alice, memory_id) == 404
    again = await post(
        api,
        alice,
        "/v1/memories",
        {
            "subject": "policy:refunds",
            "kind": "fact",
            "key": "refund.again",
            "value": POLICY,
            "new_key": True,
        },
    )
    assert again.status_code == 201, again.text
    assert again.json()["memory"]["status"] == "hidden"

    back = await api.http.post(
        f"/v1/memories/{memory_id}/reinstate",
        json={"reason": "audit closed"},
        headers=alice.headers,
    )
    assert_problem(back, 404, "memory-not-found")
    assert (
        await scalar(
            api.runtime,
            "SELECT count(*) FROM memories WHERE id = :b AND revoked_at IS NULL",
            b=uuid.UUID(copy_id),
        )
        == 0
    )
