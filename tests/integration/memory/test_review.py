"""The review state (issue 15; docs/concepts.md, "Review"): in a space whose settings say
`review: true`, a write by a non-reviewer lands as a proposal, visible to its writer and the
space's reviewers only (every read surface, and no job reads it), superseding nothing; a
reviewer approves it (it supersedes as any write) or rejects it (a tombstone; the same text,
case and white space aside, cannot be proposed there again by a non-reviewer)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from service.auth.exchange import ACCESS_TOKEN_TYPE, TOKEN_EXCHANGE
from service.consolidation.jobs import CONSOLIDATION
from service.memory.normalize import normalized as normalized_text
from service.settings import MemorySettings, Settings
from tests.conftest import make_settings
from tests.fixtures.api import MEMORY_SCOPES, Agent, Api
from tests.integration.jobs.consolidation_support import (
    grant,
    job_principal,
    run_job,
    service_subject,
    summaries,
)
from tests.integration.memory.revocation_support import reinstate, revoke
from tests.integration.memory.support import as_owner, assert_problem

SUBJECT = "service:billing"
REVIEWER_SCOPES = (*MEMORY_SCOPES, "review:memory", "manage:delegates")
PROPOSED_TEXT = "Refunds above 500 EUR are approved by the on-call agent"
MODES = ("hybrid", "vector", "lexical")


@pytest.fixture
def settings(database_url: str, tmp_path: Path, request: pytest.FixtureRequest) -> Settings:
    limits = getattr(request, "param", MemorySettings())
    return replace(make_settings(database_url, tmp_path), memory=limits)


@dataclass
class Reviewed:
    api: Api
    space_id: str
    reviewer: Agent
    writer: Agent
    reader: Agent


async def _reviewed(api: Api) -> Reviewed:
    """A team space with `review: true`: rita reviews it (review grant + review:memory);
    wally writes and reads there, rhea too, neither reviews."""
    reviewer = await api.new_agent("rita", scopes=REVIEWER_SCOPES)
    writer = await api.new_agent("wally", scopes=(*MEMORY_SCOPES, "review:memory"))
    reader = await api.new_agent("rhea")
    admin = api.admin.headers
    team = (await api.http.post("/v1/teams", json={"name": "billing"}, headers=admin)).json()
    created = await api.http.post("/v1/spaces", json={"name": "billing"}, headers=admin)
    assert created.status_code == 201, created.text
    space_id: str = created.json()["space"]["id"]
    await grant(api, space_id, team["subject"], "read", "write")
    await grant(api, space_id, f"user:{reviewer.principal_id}", "review")
    for member in (reviewer, writer, reader):
        added = await api.http.put(
            f"/v1/teams/{team['id']}/members/{member.principal_id}", headers=admin
        )
        assert added.status_code == 200, added.text
    settings = await api.http.put(
        f"/v1/spaces/{space_id}/settings", json={"review": True}, headers=admin
    )
    assert settings.status_code == 200, settings.text
    assert settings.json()["settings"]["review"] is True
    return Reviewed(api, space_id, reviewer, writer, reader)


async def _write(world: Reviewed, agent: Agent, **fields: Any) -> httpx.Response:
    body = {
        "subject": SUBJECT,
        "kind": "fact",
        "key": "refunds.approval",
        "value": PROPOSED_TEXT,
        "space_id": world.space_id,
        "new_key": True,
    } | fields
    response: httpx.Response = await world.api.http.post(
        "/v1/memories", json=body, headers=agent.headers
    )
    return response


async def _propose(world: Reviewed, **fields: Any) -> dict[str, Any]:
    response = await _write(world, world.writer, **fields)
    assert response.status_code == 201, response.text
    memory: dict[str, Any] = response.json()["memory"]
    assert memory["status"] == "proposed"
    assert memory["version"] == 0
    return memory


async def _seen_ids(world: Reviewed, agent: Agent, memory_id: str) -> dict[str, bool]:
    """Whether `memory_id` reaches `agent` on each read surface."""
    http, headers = world.api.http, agent.headers
    seen: dict[str, bool] = {}
    for mode in MODES:
        found = await world.api.search(agent, PROPOSED_TEXT, k=50, min_score=0, mode=mode)
        assert found.status_code == 200, found.text
        seen[f"search:{mode}"] = memory_id in [h["memory"]["id"] for h in found.json()["hits"]]
    listed = await http.get("/v1/memories", params={"limit": 100}, headers=headers)
    seen["list"] = memory_id in [m["id"] for m in listed.json()["items"]]
    got = await http.get(f"/v1/memories/{memory_id}", headers=headers)
    seen["get"] = got.status_code == 200
    if got.status_code != 200:
        assert_problem(got, 404, "memory-not-found")
    history = await http.get(f"/v1/memories/{memory_id}/history", headers=headers)
    seen["history"] = history.status_code == 200
    return seen


async def _count(world: Reviewed, agent: Agent) -> int:
    counted = await world.api.http.get(
        "/v1/memories/counts", params={"space_id": world.space_id}, headers=agent.headers
    )
    assert counted.status_code == 200, counted.text
    return int(counted.json()["total"])


async def test_a_non_reviewers_write_is_a_proposal_seen_by_its_writer_and_reviewers_only(
    api: Api,
) -> None:
    world = await _reviewed(api)
    proposal = await _propose(world, confidence=0.7, source="agent:triage")
    assert proposal["confidence"] == 0.7
    assert proposal["provenance"]["source"] == "agent:triage"

    nowhere = {f"search:{m}": False for m in MODES} | {
        "list": False,
        "get": False,
        "history": False,
    }
    everywhere = dict.fromkeys(nowhere, True)
    assert await _seen_ids(world, world.reader, proposal["id"]) == nowhere
    assert await _seen_ids(world, world.writer, proposal["id"]) == everywhere
    assert await _seen_ids(world, world.reviewer, proposal["id"]) == everywhere
    # Counts cover what list and search return to each.
    assert await _count(world, world.reader) == 0
    assert await _count(world, world.writer) == 1
    assert await _count(world, world.reviewer) == 1

    got = await api.http.get(f"/v1/memories/{proposal['id']}", headers=world.writer.headers)
    assert got.json()["status"] == "proposed"
    assert got.json()["confidence"] == 0.7

    listed = await api.http.get(
        f"/v1/spaces/{world.space_id}/proposals", headers=world.reviewer.headers
    )
    assert listed.status_code == 200, listed.text
    assert [m["id"] for m in listed.json()["items"]] == [proposal["id"]]


async def test_a_proposal_supersedes_nothing_until_approved(api: Api) -> None:
    world = await _reviewed(api)
    current = await _write(world, world.reviewer, value="Refunds above 500 EUR need a human")
    assert current.status_code == 201, current.text
    old = current.json()["memory"]
    assert (old["status"], old["version"]) == ("live", 1)

    proposal = await _propose(world)
    assert (await _write(world, world.writer)).json()["superseded"] == []
    still = await api.http.get(f"/v1/memories/{old['id']}", headers=world.reader.headers)
    assert (still.json()["status"], still.json()["superseded_by"]) == ("live", None)

    approved = await api.http.post(
        f"/v1/memories/{proposal['id']}/approve", headers=world.reviewer.headers
    )
    assert approved.status_code == 200, approved.text
    body = approved.json()
    assert body["superseded"] == [old["id"]]
    assert body["memory"]["status"] == "live"
    assert (body["memory"]["version"], body["memory"]["supersedes"]) == (2, old["id"])

    now_old = await api.http.get(f"/v1/memories/{old['id']}", headers=world.reader.headers)
    assert (now_old.json()["status"], now_old.json()["superseded_by"]) == (
        "superseded",
        proposal["id"],
    )
    history = await api.http.get(
        f"/v1/memories/{proposal['id']}/history", headers=world.reader.headers
    )
    assert [(m["id"], m["version"]) for m in history.json()["items"]] == [
        (proposal["id"], 2),
        (old["id"], 1),
    ]
    # The second proposal of the key is still waiting; approving it numbers it 3.
    [waiting] = (
        await api.http.get(f"/v1/spaces/{world.space_id}/proposals", headers=world.reviewer.headers)
    ).json()["items"]
    again = await api.http.post(
        f"/v1/memories/{waiting['id']}/approve", headers=world.reviewer.headers
    )
    assert (again.json()["memory"]["version"], again.json()["superseded"]) == (3, [proposal["id"]])
    twice = await api.http.post(
        f"/v1/memories/{proposal['id']}/approve", headers=world.reviewer.headers
    )
    assert_problem(twice, 409, "not-a-proposal")
    assert await _count(world, world.reader) == 1


async def test_a_rejected_text_cannot_be_proposed_again_but_a_reviewer_may_write_it(
    api: Api,
) -> None:
    world = await _reviewed(api)
    proposal = await _propose(world)
    reason = "policy owner says no"
    rejected = await api.http.post(
        f"/v1/memories/{proposal['id']}/reject",
        json={"reason": reason},
        headers=world.reviewer.headers,
    )
    assert rejected.status_code == 200, rejected.text
    assert (rejected.json()["status"], rejected.json()["reason"]) == ("rejected", reason)
    # A tombstone: gone for everyone, its writer included.
    for agent in (world.writer, world.reviewer, world.reader):
        seen = await _seen_ids(world, agent, proposal["id"])
        assert not any(seen.values()), seen
        assert await _count(world, agent) == 0

    variants = (
        PROPOSED_TEXT,
        "  refunds ABOVE 500 eur are approved\n by the ON-CALL   agent ",
        "\uff32efunds above 500 EUR are approved by the on-call agent",  # full-width R: NFKC
    )
    for value in variants:
        assert normalized_text(value) == normalized_text(PROPOSED_TEXT)
        refused = await _write(world, world.writer, value=value)
        problem = assert_problem(refused, 409, "proposal-rejected")
        assert "rejected this text" in problem["detail"]
    batch = await api.http.post(
        "/v1/memories:batch",
        json={
            "items": [
                {"subject": SUBJECT, "kind": "fact", "key": "a", "value": "fine", "new_key": True}
                | {"space_id": world.space_id},
                {"subject": SUBJECT, "kind": "fact", "key": "b", "value": variants[1]}
                | {"space_id": world.space_id, "new_key": True},
            ]
        },
        headers=world.writer.headers,
    )
    problem = assert_problem(batch, 422, "batch-rejected")
    assert [(e["index"], e["status"]) for e in problem["errors"]] == [(1, 409)]
    # Another text is still a proposal; a reviewer writes the rejected one as an ordinary row.
    assert (await _write(world, world.writer, value="Refunds need two humans")).status_code == 201
    by_reviewer = await _write(world, world.reviewer, value=variants[1])
    assert by_reviewer.status_code == 201, by_reviewer.text
    assert by_reviewer.json()["memory"]["status"] == "live"

    async with as_owner(api.runtime) as conn:
        row = (
            await conn.execute(
                text("SELECT review_state, review_reason FROM memories WHERE id = :id"),
                {"id": proposal["id"]},
            )
        ).one()
        audited = (
            await conn.execute(
                text(
                    "SELECT count(*) FROM audit_events WHERE tenant_id = :t "
                    "AND to_jsonb(audit_events)::text ILIKE :needle"
                ),
                {"t": api.tenant_id, "needle": f"%{reason}%"},
            )
        ).scalar_one()
        decision = (
            await conn.execute(
                text(
                    "SELECT target_ids FROM audit_events WHERE tenant_id = :t "
                    "AND action = 'memory.reject'"
                ),
                {"t": api.tenant_id},
            )
        ).scalar_one()
    assert tuple(row) == ("rejected", reason)
    assert audited == 0  # the reason is on the row, never in the audit log
    assert [str(i) for i in decision] == [proposal["id"]]


async def test_batch_writes_into_a_reviewed_space_land_proposed(api: Api) -> None:
    world = await _reviewed(api)
    items = [
        {"subject": SUBJECT, "kind": "fact", "key": f"k{n}", "value": f"batch fact {n}"}
        | {"space_id": world.space_id, "new_key": True, "confidence": 0.5}
        for n in range(3)
    ]
    written = await api.http.post(
        "/v1/memories:batch", json={"items": items}, headers=world.writer.headers
    )
    assert written.status_code == 201, written.text
    memories = [item["memory"] for item in written.json()["items"]]
    assert [(m["status"], m["version"], m["confidence"]) for m in memories] == [
        ("proposed", 0, 0.5)
    ] * 3
    assert await _count(world, world.reader) == 0
    listed = await api.http.get(
        f"/v1/spaces/{world.space_id}/proposals",
        params={"limit": 2},
        headers=world.reviewer.headers,
    )
    page = listed.json()
    assert len(page["items"]) == 2
    assert page["next_cursor"]
    rest = await api.http.get(
        f"/v1/spaces/{world.space_id}/proposals",
        params={"cursor": page["next_cursor"]},
        headers=world.reviewer.headers,
    )
    ids = [m["id"] for m in page["items"] + rest.json()["items"]]
    assert sorted(ids) == sorted(m["id"] for m in memories)
    # A reviewer's own batch is ordinary.
    own = await api.http.post(
        "/v1/memories:batch",
        json={"items": [items[0] | {"key": "mine"}]},
        headers=world.reviewer.headers,
    )
    assert own.json()["items"][0]["memory"]["status"] == "live"


async def test_review_routes_refuse_callers_who_do_not_review(api: Api) -> None:
    world = await _reviewed(api)
    proposal = await _propose(world)
    ordinary = await _write(world, world.reviewer, key="other", value="ordinary fact")
    http = api.http
    proposals = f"/v1/spaces/{world.space_id}/proposals"
    approve = f"/v1/memories/{proposal['id']}/approve"
    reject = f"/v1/memories/{proposal['id']}/reject"
    reason = {"reason": "no"}
    # No token: 401.
    assert (await http.get(proposals)).status_code == 401
    assert (await http.post(approve)).status_code == 401
    assert (await http.post(reject, json=reason)).status_code == 401
    # A token without review:memory (the reviewer's own, narrowed): 403 by scope.
    narrowed = await api.access_token(
        world.reviewer.client_id, world.reviewer.secret, "read:memory write:memory"
    )
    bare = {"Authorization": f"Bearer {narrowed}"}
    assert_problem(await http.get(proposals, headers=bare), 403, "insufficient-scope")
    assert_problem(await http.post(approve, headers=bare), 403, "insufficient-scope")
    # The writer holds the scope but no review grant: its own proposal is 403, the list too.
    writer = world.writer.headers
    assert_problem(await http.get(proposals, headers=writer), 403, "not-a-reviewer")
    assert_problem(await http.post(approve, headers=writer), 403, "not-a-reviewer")
    assert_problem(await http.post(reject, json=reason, headers=writer), 403, "not-a-reviewer")
    # Another tenant's reviewer, and an id that does not exist: 404, the same bytes.
    other = await api.other_tenant()
    outsider = await other.new_agent("olga", scopes=REVIEWER_SCOPES)
    away = outsider.headers
    assert_problem(await http.get(proposals, headers=away), 404, "space-not-found")
    assert_problem(await http.post(approve, headers=away), 404, "memory-not-found")
    assert_problem(await http.post(reject, json=reason, headers=away), 404, "memory-not-found")
    # An ordinary memory is no proposal.
    assert_problem(
        await http.post(
            f"/v1/memories/{ordinary.json()['memory']['id']}/approve",
            headers=world.reviewer.headers,
        ),
        409,
        "not-a-proposal",
    )
    # A reason is required and no body field writes a review state.
    assert (await http.post(reject, json={}, headers=world.reviewer.headers)).status_code == 422
    for field in ({"review_state": None}, {"review_state": "proposed"}, {"revoked_at": None}):
        refused = await _write(world, world.reviewer, key="sneaky", **field)
        assert refused.status_code == 422, refused.text
    # Nothing above changed the proposal.
    assert (await http.get(approve.removesuffix("/approve"), headers=writer)).json()[
        "status"
    ] == "proposed"


async def test_an_agent_acting_for_a_reviewer_only_proposes_and_never_reviews(api: Api) -> None:
    world = await _reviewed(api)
    bot = await api.new_principal("helper-bot", kind="agent")
    created = await api.new_client(bot["id"], [*MEMORY_SCOPES, "review:memory"])
    # The agent itself may write in the space and even holds a review grant.
    await grant(api, world.space_id, f"agent:{bot['id']}", "read", "write", "review")
    allowed = await api.http.put(
        f"/v1/principals/{world.reviewer.principal_id}/delegates/{bot['id']}",
        headers=world.reviewer.headers,
    )
    assert allowed.status_code in (200, 201, 204), allowed.text
    exchanged = await api.http.post(
        "/oauth/token",
        data={
            "grant_type": TOKEN_EXCHANGE,
            "subject_token": world.reviewer.token,
            "subject_token_type": ACCESS_TOKEN_TYPE,
        },
        auth=(created["client"]["client_id"], created["client_secret"]),
    )
    assert exchanged.status_code == 200, exchanged.text
    assert "review:memory" in exchanged.json()["scope"].split()
    agent = Agent(world.reviewer.principal_id, "", "", exchanged.json()["access_token"])
    written = await _write(world, agent)
    assert written.status_code == 201, written.text
    assert written.json()["memory"]["status"] == "proposed"
    memory_id = written.json()["memory"]["id"]
    assert_problem(
        await api.http.post(f"/v1/memories/{memory_id}/approve", headers=agent.headers),
        403,
        "not-a-reviewer",
    )
    # The agent's own token (an agent principal) never reviews either.
    own = Agent(
        bot["id"],
        created["client"]["client_id"],
        created["client_secret"],
        await api.access_token(created["client"]["client_id"], created["client_secret"]),
    )
    assert (await _write(world, own, key="bot")).json()["memory"]["status"] == "proposed"
    assert_problem(
        await api.http.get(f"/v1/spaces/{world.space_id}/proposals", headers=own.headers),
        403,
        "not-a-reviewer",
    )
    # The user herself approves it.
    approved = await api.http.post(
        f"/v1/memories/{memory_id}/approve", headers=world.reviewer.headers
    )
    assert approved.status_code == 200, approved.text


async def test_jobs_never_read_proposals(api: Api) -> None:
    world = await _reviewed(api)
    ordinary = await _write(world, world.reviewer, key="window", value="Deploys run on Tuesdays")
    assert ordinary.status_code == 201, ordinary.text
    proposal = await _propose(world, key="freeze", value="Deploys are frozen in December")
    job = await job_principal(api)
    await grant(api, world.space_id, service_subject(job), "read", "write", "delete")
    await run_job(api.runtime, CONSOLIDATION, job, space_id=world.space_id, subject=SUBJECT)
    made = [row for row in await summaries(api.runtime) if row["space_id"] is not None]
    assert made, "the ordinary memory alone is consolidated"
    for row in made:
        assert proposal["id"] not in [str(i) for i in row["derived_from"]]
        assert "frozen" not in row["value"]


@pytest.mark.parametrize(
    "settings", [MemorySettings(exact_search_max_rows=0)], indirect=True, ids=["walk"]
)
async def test_proposals_take_no_slot_of_another_readers_search(api: Api) -> None:
    """Sixty proposed near-duplicates of the query sit nearest to it in the HNSW index; the
    reader, who sees none of them, still gets k hits (the approximate path always walks)."""
    world = await _reviewed(api)
    k = 5
    near = [
        {"subject": SUBJECT, "kind": "fact", "key": f"dup{n}", "value": f"{PROPOSED_TEXT} {n}"}
        | {"space_id": world.space_id, "new_key": True}
        for n in range(60)
    ]
    proposed = await api.http.post(
        "/v1/memories:batch", json={"items": near}, headers=world.writer.headers
    )
    assert proposed.status_code == 201, proposed.text
    ordinary = [
        (await _write(world, world.reviewer, key=f"far{n}", value=f"Lunch menu item {n}")).json()
        for n in range(k)
    ]
    for mode in MODES:
        found = await api.search(world.reader, PROPOSED_TEXT, k=k, min_score=0, mode=mode)
        assert found.status_code == 200, found.text
        hits = [hit["memory"] for hit in found.json()["hits"]]
        if mode != "lexical":  # the lexical leg matches only the query's words
            assert sorted(h["id"] for h in hits) == sorted(o["memory"]["id"] for o in ordinary)
        assert all(h["status"] == "live" for h in hits)
    mine = await api.search(world.writer, PROPOSED_TEXT, k=k, min_score=0, mode="vector")
    assert all(h["memory"]["status"] == "proposed" for h in mine.json()["hits"])
    assert len(mine.json()["hits"]) == k


async def test_if_match_changes_the_key_while_a_proposal_waits_on_it(api: Api) -> None:
    """A waiting proposal is unsuperseded and visible to its writer and the reviewers, but it is
    no version of the key: the If-Match lookup ignores it (was MultipleResultsFound → 500)."""
    world = await _reviewed(api)
    first = await _write(world, world.reviewer, value="Refund limit is 300 EUR")
    assert first.status_code == 201, first.text
    etag = first.json()["memory"]["etag"]
    await _propose(world, value="Refund limit is 5000 EUR", new_key=False)
    for agent in (world.reviewer, world.writer):
        stale = await world.api.http.post(
            "/v1/memories",
            json={
                "subject": SUBJECT,
                "kind": "fact",
                "key": "refunds.approval",
                "value": "Refund limit is 1 EUR",
                "space_id": world.space_id,
            },
            headers=agent.headers | {"If-Match": '"00000000-0000-0000-0000-000000000000.1"'},
        )
        assert_problem(stale, 412, "precondition-failed")
        assert stale.json()["current_etag"] == etag
    second = await world.api.http.post(
        "/v1/memories",
        json={
            "subject": SUBJECT,
            "kind": "fact",
            "key": "refunds.approval",
            "value": "Refund limit is 250 EUR",
            "space_id": world.space_id,
        },
        headers=world.reviewer.headers | {"If-Match": etag},
    )
    assert second.status_code == 201, second.text
    assert second.json()["memory"]["version"] == 2


async def test_approve_and_reject_honour_if_match(api: Api) -> None:
    """Approve's If-Match names the live version the proposal supersedes: a version written
    since the reviewer read the key is 412, naming it, and the proposal stays waiting. Reject's
    names the proposal itself. Stale changes nothing."""
    world = await _reviewed(api)
    first = await _write(world, world.reviewer, value="Refund limit is 300 EUR")
    etag_v1 = first.json()["memory"]["etag"]
    proposal = await _propose(world, value="Refund limit is 5000 EUR", new_key=False)
    second = await _write(world, world.reviewer, value="Refund limit is 250 EUR", new_key=False)
    assert second.status_code == 201, second.text
    etag_v2 = second.json()["memory"]["etag"]
    approve = f"/v1/memories/{proposal['id']}/approve"
    stale = await world.api.http.post(
        approve, headers=world.reviewer.headers | {"If-Match": etag_v1}
    )
    assert_problem(stale, 412, "precondition-failed")
    assert stale.json()["current_etag"] == etag_v2
    # Nothing changed: the proposal waits, version 2 is live.
    [waiting] = (
        await world.api.http.get(
            f"/v1/spaces/{world.space_id}/proposals", headers=world.reviewer.headers
        )
    ).json()["items"]
    assert waiting["id"] == proposal["id"]
    live = await world.api.http.get(
        "/v1/memories", params={"key": "refunds.approval"}, headers=world.reader.headers
    )
    assert [item["etag"] for item in live.json()["items"]] == [etag_v2]
    approved = await world.api.http.post(
        approve, headers=world.reviewer.headers | {"If-Match": etag_v2}
    )
    assert approved.status_code == 200, approved.text
    assert approved.json()["memory"]["version"] == 3
    assert approved.json()["superseded"] == [second.json()["memory"]["id"]]

    other = await _propose(world, value="Refund limit is 10 EUR", new_key=False)
    reject = f"/v1/memories/{other['id']}/reject"
    body = {"reason": "not our policy"}
    wrong = await world.api.http.post(
        reject, json=body, headers=world.reviewer.headers | {"If-Match": etag_v2}
    )
    assert_problem(wrong, 412, "precondition-failed")
    assert wrong.json()["current_etag"] == other["etag"] == f'"{other["id"]}.0"'
    rejected = await world.api.http.post(
        reject, json=body, headers=world.reviewer.headers | {"If-Match": other["etag"]}
    )
    assert rejected.status_code == 200, rejected.text
    assert rejected.json()["status"] == "rejected"


async def test_approving_a_proposal_a_revoke_in_flight_hides_is_404(api: Api) -> None:
    """Approve takes the tenant's revocation lock shared, as writes do: a revoke in flight
    that hides the proposal commits first, and the approval finds no proposal (404, nothing
    changed) instead of its update finding no row (was a 500)."""
    import threading
    import time
    import uuid

    import psycopg

    from service.revocation.repository import lock_name
    from tests.fixtures.entrance import bypasses_visible

    world = await _reviewed(api)
    first = await _write(world, world.reviewer, value="Refund limit is 300 EUR")
    etag = first.json()["memory"]["etag"]
    proposal = await _propose(world, value="Refund limit is 5000 EUR", new_key=False)
    name = lock_name(uuid.UUID(api.tenant_id))
    held, release = threading.Event(), threading.Event()

    def revoke_in_flight() -> None:
        # What a revoke does, from another connection: the lock, the revocation, the hiding.
        with (
            bypasses_visible("test: a revoke by hand, as the SECURITY DEFINER function does"),
            psycopg.connect(api.runtime.settings.database.url) as conn,
        ):
            conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (name,))
            conn.execute("SELECT set_config('memgate.tenant_id', %s, true)", (api.tenant_id,))
            revocation = uuid.uuid4()
            conn.execute(
                "INSERT INTO revocations (tenant_id, id, memory_id, space_id, content_hash, "
                "reason, revoked_by) SELECT tenant_id, %s, id, space_id, content_hash, 'test', "
                "owner_id FROM memories WHERE id = %s",
                (revocation, proposal["id"]),
            )
            conn.execute("SELECT memgate_revocation_hide(%s)", (revocation,))
            held.set()
            release.wait(timeout=30)
            conn.commit()

    holder = threading.Thread(target=revoke_in_flight)
    holder.start()
    assert held.wait(timeout=30)
    threading.Timer(1.5, release.set).start()
    started = time.monotonic()
    approved = await world.api.http.post(
        f"/v1/memories/{proposal['id']}/approve", headers=world.reviewer.headers
    )
    waited = time.monotonic() - started
    holder.join(timeout=30)
    assert waited >= 1.4, "the approval did not wait for the revocation lock"
    assert_problem(approved, 404, "memory-not-found")
    live = await world.api.http.get(
        "/v1/memories", params={"key": "refunds.approval"}, headers=world.reader.headers
    )
    assert [item["etag"] for item in live.json()["items"]] == [etag]


async def _stored(api: Api, memory_id: str) -> dict[str, Any]:
    async with as_owner(api.runtime) as conn:
        row = (
            await conn.execute(
                text(
                    "SELECT value, review_state, superseded_at, superseded_by, revoked_at "
                    "FROM memories WHERE id = :id"
                ),
                {"id": memory_id},
            )
        ).mappings()
        return dict(row.one())


async def test_a_reinstated_fact_is_not_closed_by_a_pending_proposal(api: Api) -> None:
    """The lift leaves proposals out: reinstating a fact while a proposal waits on its key
    brings the fact back live, and the proposal stays a proposal, untouched."""
    world = await _reviewed(api)
    await grant(api, world.space_id, f"user:{world.reviewer.principal_id}", "delete")
    fact = await _write(world, world.reviewer, value="Refund limit is 300 EUR")
    assert fact.status_code == 201, fact.text
    fact_id = fact.json()["memory"]["id"]
    await revoke(api, world.reviewer, fact_id, "under audit")
    proposed = await _write(world, world.writer, value="Refund limit is 5000 EUR")
    assert proposed.status_code == 201, proposed.text
    assert proposed.json()["memory"]["status"] == "proposed"
    proposal_id = proposed.json()["memory"]["id"]
    before = await _stored(api, proposal_id)

    await reinstate(api, world.reviewer, fact_id, "audit closed")

    seen = await api.http.get(f"/v1/memories/{fact_id}", headers=world.reader.headers)
    assert seen.status_code == 200, seen.text
    assert seen.json()["status"] == "live"
    assert seen.json()["superseded_by"] is None
    assert await _stored(api, proposal_id) == before
    assert before["review_state"] == "proposed"
    assert before["superseded_at"] is None


async def test_a_proposal_coming_back_stays_a_proposal_beside_the_live_fact(api: Api) -> None:
    """The other direction: a proposal hidden as a copy of a revoked memory comes back as a
    proposal; the live version of its key does not close it."""
    world = await _reviewed(api)
    await grant(api, world.space_id, f"user:{world.reviewer.principal_id}", "delete")
    live = await _write(world, world.reviewer, value="Refund limit is 300 EUR")
    assert live.status_code == 201, live.text
    proposed = await _write(world, world.writer, value="Refund limit is 5000 EUR")
    assert proposed.status_code == 201, proposed.text
    proposal_id = proposed.json()["memory"]["id"]
    twin = await _write(world, world.reviewer, key="refunds.copy", value="Refund limit is 5000 EUR")
    assert twin.status_code == 201, twin.text
    twin_id = twin.json()["memory"]["id"]
    await revoke(api, world.reviewer, twin_id, "under audit")
    assert (await _stored(api, proposal_id))["revoked_at"] is not None  # hidden as a copy

    await reinstate(api, world.reviewer, twin_id, "audit closed")

    back = await _stored(api, proposal_id)
    assert back["review_state"] == "proposed"
    assert back["revoked_at"] is None
    assert back["superseded_at"] is None
    assert back["superseded_by"] is None
    still = await api.http.get(
        f"/v1/memories/{live.json()['memory']['id']}", headers=world.reader.headers
    )
    assert still.json()["status"] == "live"
    assert still.json()["superseded_by"] is None
