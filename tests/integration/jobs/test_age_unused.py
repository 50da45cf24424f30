"""`memory.age_unused` (issue 13): in a space with `max_unused_days`, a memory neither written
nor recalled for that long expires (in place: no new version) and drops out of reads; one
recalled recently survives; a dry run changes nothing; a job principal without grants does
nothing."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import text

from service.jobs.declare import RunScope
from service.memory.jobs import AGE_UNUSED_JOB
from tests.fixtures.api import Agent, Api
from tests.integration.jobs.batch_support import job_principal, run_all, run_batch
from tests.integration.memory.support import as_owner


async def _aged_setup(api: Api) -> tuple[Agent, dict[str, dict[str, Any]]]:
    """Alice's personal space ages after 30 days; three memories written 60 days ago (one of
    them recalled today), one written today."""
    alice = await api.new_agent("alice")
    memories = {
        "used": await api.remember(alice, key="deploy.window", value="Deploys happen on Tuesdays"),
        "unused": await api.remember(alice, key="lunch", value="The canteen serves soup"),
        "also_unused": await api.remember(alice, key="parking", value="Parking is in lot B"),
    }
    old = [memories[name]["id"] for name in memories]
    memories["fresh"] = await api.remember(alice, key="oncall", value="Oncall rotates weekly")
    space = memories["used"]["space_id"]
    response = await api.http.put(
        f"/v1/spaces/{space}/settings", json={"max_unused_days": 30}, headers=api.admin.headers
    )
    assert response.status_code == 200, response.text
    assert response.json()["settings"]["max_unused_days"] == 30
    async with as_owner(api.runtime) as conn:
        await conn.execute(
            text(
                "UPDATE memories SET recorded_at = recorded_at - interval '60 days', "
                "valid_from = valid_from - interval '60 days' WHERE id = ANY(:ids)"
            ),
            {"ids": [uuid.UUID(i) for i in old]},
        )
        await conn.commit()
    found = await api.search(alice, "when do deploys happen", k=1)
    assert [hit["memory"]["id"] for hit in found.json()["hits"]] == [memories["used"]["id"]]
    await api.runtime.recalls.flush()
    return alice, memories


async def _stored(api: Api) -> dict[str, tuple[Any, int, int]]:
    """By id: (expires_at, version, rows of its key) as stored."""
    async with as_owner(api.runtime) as conn:
        found = await conn.execute(
            text(
                "SELECT id::text, expires_at, version, "
                "count(*) OVER (PARTITION BY space_id, subject, kind, key) FROM memories"
            )
        )
        return {row[0]: (row[1], row[2], row[3]) for row in found.all()}


async def test_a_recalled_memory_survives_and_an_unused_one_expires(api: Api) -> None:
    alice, memories = await _aged_setup(api)
    before = await _stored(api)
    job = job_principal(api, alice.principal_id)

    counts, batches = await run_all(
        api.runtime, AGE_UNUSED_JOB, job, RunScope(uuid.UUID(api.tenant_id))
    )
    assert counts == {"examined": 4, "expired": 2}
    assert batches == 1

    after = await _stored(api)
    expired = {memories["unused"]["id"], memories["also_unused"]["id"]}
    for memory_id, (expires_at, version, versions) in after.items():
        # In place: no new version, the same number, nothing else of the chain changed.
        assert (version, versions) == before[memory_id][1:]
        assert (expires_at is not None) == (memory_id in expired), memory_id
    # Out of every read at once.
    for name, memory in memories.items():
        got = await api.http.get(f"/v1/memories/{memory['id']}", headers=alice.headers)
        assert got.status_code == (404 if memory["id"] in expired else 200), name
    hits = (await api.search(alice, "canteen soup parking lot", min_score=0)).json()["hits"]
    assert expired.isdisjoint(hit["memory"]["id"] for hit in hits)
    listed = await api.http.get("/v1/memories", headers=alice.headers)
    assert {item["id"] for item in listed.json()["items"]} == {
        memories["used"]["id"],
        memories["fresh"]["id"],
    }

    # Again: nothing left to expire (idempotent).
    again, _ = await run_all(api.runtime, AGE_UNUSED_JOB, job, RunScope(uuid.UUID(api.tenant_id)))
    assert again == {"examined": 2, "expired": 0}


async def test_a_dry_run_counts_and_changes_nothing(api: Api) -> None:
    alice, _memories = await _aged_setup(api)
    before = await _stored(api)
    scope = RunScope(uuid.UUID(api.tenant_id), dry_run=True)
    counts, _ = await run_all(
        api.runtime, AGE_UNUSED_JOB, job_principal(api, alice.principal_id), scope
    )
    assert counts == {"examined": 4, "would_expire": 2}
    assert await _stored(api) == before


async def test_batches_are_bounded_and_resume_from_their_cursor(api: Api) -> None:
    alice, memories = await _aged_setup(api)
    job = job_principal(api, alice.principal_id)
    scope = RunScope(uuid.UUID(api.tenant_id))
    first = await run_batch(api.runtime, AGE_UNUSED_JOB, job, scope, size=1)
    assert first.counts["examined"] == 1
    assert first.cursor is not None
    # The same batch again from the same cursor: safe (what it expired is no longer live).
    await run_batch(api.runtime, AGE_UNUSED_JOB, job, scope, size=1)
    _counts, batches = await run_all(
        api.runtime, AGE_UNUSED_JOB, job, scope, size=1, cursor=first.cursor
    )
    assert batches >= 3
    expired = {i for i, (at, _, _) in (await _stored(api)).items() if at is not None}
    assert expired == {memories["unused"]["id"], memories["also_unused"]["id"]}


async def test_a_space_without_the_setting_never_ages(api: Api) -> None:
    alice, memories = await _aged_setup(api)
    space = memories["used"]["space_id"]
    off = await api.http.put(f"/v1/spaces/{space}/settings", json={}, headers=api.admin.headers)
    assert off.json()["settings"]["max_unused_days"] is None
    counts, _ = await run_all(
        api.runtime,
        AGE_UNUSED_JOB,
        job_principal(api, alice.principal_id),
        RunScope(uuid.UUID(api.tenant_id)),
    )
    assert counts == {"examined": 0, "expired": 0}
    assert all(at is None for at, _, _ in (await _stored(api)).values())


async def test_a_job_principal_without_grants_does_nothing(api: Api) -> None:
    """A principal holding no grant on Alice's space (Bob), one holding none at all, and
    another tenant's job naming Alice's principal id: none sees a row, so none expires any."""
    alice, _ = await _aged_setup(api)
    before = await _stored(api)
    bob = await api.new_principal("bob")
    other = await api.other_tenant()
    for principal in (
        job_principal(api, bob["id"]),
        job_principal(api, uuid.uuid4()),
        job_principal(other, alice.principal_id),
    ):
        counts, _ = await run_all(
            api.runtime, AGE_UNUSED_JOB, principal, RunScope(principal.tenant_id)
        )
        assert counts == {"examined": 0, "expired": 0}
    assert await _stored(api) == before


async def test_each_batch_is_audited_with_its_counts(api: Api) -> None:
    alice, memories = await _aged_setup(api)
    await run_all(
        api.runtime,
        AGE_UNUSED_JOB,
        job_principal(api, alice.principal_id),
        RunScope(uuid.UUID(api.tenant_id)),
    )
    async with as_owner(api.runtime) as conn:
        found = await conn.execute(
            text(
                "SELECT status, result_count, target_ids FROM audit_events "
                "WHERE action = 'memory.age_unused'"
            )
        )
        rows = found.all()
    assert len(rows) == 1
    status, result_count, targets = rows[0]
    assert (status, result_count) == (200, 2)
    assert {str(t) for t in targets} == {memories["unused"]["id"], memories["also_unused"]["id"]}
