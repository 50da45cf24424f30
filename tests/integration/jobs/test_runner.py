"""The runner's guarantees: one runner per batch, resumable after a crash or a cancel, refused
without grants, grants at enqueue ∩ grants now, and every batch audited."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

from service.jobs.declare import Batch, BatchDone, Job
from service.jobs.runner import Progress, Runner
from service.memory.sweep import SWEEP_EXPIRED, sweep_expired
from tests.fixtures.api import Api
from tests.integration.jobs.support import (
    Setup,
    audit_rows,
    expire,
    grant,
    new_space,
    queue,
    revoke,
    run_of,
    runner,
    setup,
    stored_ids,
)
from tests.integration.tenants.support import platform

SWEEP = "memory.sweep_expired"
SWEEP_JOBS = {SWEEP: SWEEP_EXPIRED}
EXPECTED = {"scanned": 10, "deleted": 0, "retracted": 10}
"""Ten expired heads, batches of three: 3 + 3 + 3 + 1."""


async def _expired(s: Setup, n: int = 10, space_id: str | None = None) -> list[str]:
    ids = []
    for i in range(n):
        memory = await s.api.remember(
            s.writer, key=f"old{i}", value=f"old {i}", space_id=space_id or s.space_id
        )
        ids.append(memory["id"])
    await expire(s.api, ids, days_ago=40)
    return ids


async def _values(api: Api) -> dict[str, str]:
    from sqlalchemy import text

    from tests.integration.memory.support import as_owner

    async with as_owner(api.runtime) as conn:
        rows = await conn.execute(text("SELECT id::text, value FROM memories"))
        return {row[0]: row[1] for row in rows}


def _with(batch_fn: Any) -> dict[str, Job]:
    return {SWEEP: replace(SWEEP_EXPIRED, run_batch=batch_fn)}


async def test_two_runners_at_once_never_run_the_same_batch(api: Api) -> None:
    s = await setup(api)
    swept = await _expired(s)
    calls: list[str | None] = []

    async def slow(batch: Batch) -> BatchDone:
        calls.append(batch.cursor)
        await asyncio.sleep(0.05)  # both runners are inside a step at the same time
        return await sweep_expired(batch)

    run_id = await queue(api, SWEEP)
    jobs = _with(slow)
    await asyncio.gather(
        runner(api, jobs).run(s.tenant, run_id), runner(api, jobs).run(s.tenant, run_id)
    )
    run = await run_of(api, run_id)
    assert run["status"] == "finished"
    assert run["counts"] == EXPECTED
    assert run["batches"] == 4
    assert len(calls) == 4
    assert len(set(calls)) == 4
    rows = await audit_rows(api, SWEEP, run_id)
    assert [r["result_count"] for r in rows] == [3, 3, 3, 1]
    assert all(r["status"] == 200 for r in rows)
    values = await _values(api)
    assert all(values[i] == "" for i in swept)  # every head is a stub now


async def test_a_batch_that_fails_half_way_is_rolled_back_and_the_run_resumes(api: Api) -> None:
    s = await setup(api)
    swept = await _expired(s)
    failed: list[bool] = []

    async def flaky(batch: Batch) -> BatchDone:
        done = await sweep_expired(batch)  # does its work ...
        if batch.cursor is not None and not failed:
            failed.append(True)
            raise RuntimeError("killed")  # ... and dies before committing it
        return done

    run_id = await queue(api, SWEEP)
    with pytest.raises(RuntimeError):
        await runner(api, _with(flaky)).run(s.tenant, run_id)
    half = await run_of(api, run_id)
    assert half["status"] == "running"
    assert half["counts"] == {"scanned": 3, "deleted": 0, "retracted": 3}
    assert half["error"]["slug"] == "internal-error"
    values = await _values(api)
    assert sum(values[i] == "" for i in swept) == 3  # the failed batch left nothing behind
    await runner(api, _with(flaky)).run(s.tenant, run_id)
    run = await run_of(api, run_id)
    assert (run["status"], run["counts"], run["batches"]) == ("finished", EXPECTED, 4)
    values = await _values(api)
    assert all(values[i] == "" for i in swept)
    rows = await audit_rows(api, SWEEP, run_id)
    assert [(r["status"], r["decision"]) for r in rows] == [
        (200, "allow"),
        (500, "error"),
        (200, "allow"),
        (200, "allow"),
        (200, "allow"),
    ]


async def test_a_cancelled_runner_is_resumed_after_its_lease_and_not_before(api: Api) -> None:
    s = await setup(api)
    swept = await _expired(s)
    run_id = await queue(api, SWEEP)
    first = runner(api)
    task = asyncio.create_task(first.run(s.tenant, run_id))

    def cancel(_: Progress) -> None:  # after the first batch committed
        task.cancel()

    first.on_progress = cancel
    with pytest.raises(asyncio.CancelledError):
        await task
    half = await run_of(api, run_id)
    assert (half["status"], half["batches"]) == ("running", 1)
    # A live run (fresh heartbeat) is not taken up by another runner (the setup's queued dry
    # run is) ...
    await Runner(api.runtime, first.jobs, batch_size=3, lease_seconds=300).pick_up()
    assert (await run_of(api, run_id))["batches"] == 1
    # ... one whose heartbeat is older than the lease is, from its last committed cursor.
    await asyncio.sleep(0.2)
    assert await Runner(api.runtime, first.jobs, batch_size=3, lease_seconds=0.1).pick_up() >= 1
    run = await run_of(api, run_id)
    assert (run["status"], run["counts"], run["batches"]) == ("finished", EXPECTED, 4)
    values = await _values(api)
    assert all(values[i] == "" for i in swept)
    rows = await audit_rows(api, SWEEP, run_id)
    assert [r["result_count"] for r in rows] == [3, 3, 3, 1]


async def test_a_job_principal_without_grants_does_nothing_and_says_so(api: Api) -> None:
    s = await setup(api, job_actions=())
    swept = await _expired(s, 3)
    before = await _values(api)
    run_id = await queue(api, SWEEP)
    await runner(api).run(s.tenant, run_id)
    run = await run_of(api, run_id)
    assert run["status"] == "refused"
    assert run["error"]["slug"] == "job-grants-missing"
    assert "'delete'" in run["error"]["detail"]
    assert f"service:{s.job_principal}" in run["error"]["detail"]
    assert run["counts"] == {}
    assert run["batches"] == 0
    assert await _values(api) == before
    assert set(swept) <= await stored_ids(api)
    rows = await audit_rows(api, SWEEP, run_id)
    assert [(r["status"], r["decision"], r["reason"]) for r in rows] == [
        (403, "deny", "job-grants-missing")
    ]


async def test_a_grant_removed_after_enqueue_stops_the_next_batch(api: Api) -> None:
    s = await setup(api)
    other = await new_space(api, "other")
    for action in ("read", "write", "delete"):
        await grant(api, other, action, f"user:{s.writer.principal_id}")
    for action in ("read", "delete"):
        await grant(api, other, action, f"service:{s.job_principal}")
    kept = await _expired(s, 2, other)
    swept = await _expired(s, 2)
    run_id = await queue(api, SWEEP)
    await revoke(api, other, "read", f"service:{s.job_principal}")
    await runner(api).run(s.tenant, run_id)
    values = await _values(api)
    assert all(values[i] == "" for i in swept)
    assert all(values[i] != "" for i in kept)
    assert (await run_of(api, run_id))["counts"]["retracted"] == 2


async def test_a_grant_added_after_enqueue_is_not_used_by_that_run(api: Api) -> None:
    s = await setup(api)
    other = await new_space(api, "other")
    for action in ("read", "write", "delete"):
        await grant(api, other, action, f"user:{s.writer.principal_id}")
    # The admin who starts the runs reads the space (a run stays inside its starter's reads).
    await grant(api, other, "read", f"user:{api.admin.principal_id}")
    kept = await _expired(s, 2, other)
    swept = await _expired(s, 2)
    run_id = await queue(api, SWEEP)
    for action in ("read", "delete"):
        await grant(api, other, action, f"service:{s.job_principal}")
    await runner(api).run(s.tenant, run_id)
    values = await _values(api)
    assert all(values[i] == "" for i in swept)
    assert all(values[i] != "" for i in kept)
    # A run queued now holds the new grant.
    later = await queue(api, SWEEP)
    await runner(api).run(s.tenant, later)
    values = await _values(api)
    assert all(values[i] == "" for i in kept)


async def test_read_requires_outside_the_snapshot_is_not_visible_to_the_run(api: Api) -> None:
    s = await setup(api)
    private = await new_space(api, "private")
    for action in ("read", "write", "delete"):
        await grant(api, private, action, f"user:{s.writer.principal_id}")
    source = await api.remember(s.writer, key="source", value="source", space_id=private)
    derived = await api.remember(
        s.writer, key="derived", value="derived", space_id=s.space_id, derived_from=[source["id"]]
    )
    await expire(api, [derived["id"]], days_ago=40)
    run_id = await queue(api, SWEEP)
    # Read on the input's space, granted after enqueue, does not widen what the run reads.
    await grant(api, private, "read", f"service:{s.job_principal}")
    await runner(api).run(s.tenant, run_id)
    assert (await _values(api))[derived["id"]] == "derived"
    assert (await run_of(api, run_id))["counts"]["scanned"] == 0


async def test_a_disabled_tenants_run_waits_and_goes_on_once_enabled(api: Api) -> None:
    s = await setup(api)
    swept = await _expired(s, 4)
    run_id = await queue(api, SWEEP)
    admin = await platform(api)
    disabled = await admin.http.post(
        f"/v1/tenants/{api.tenant_id}/disable", headers=admin.admin.headers
    )
    assert disabled.status_code == 200, disabled.text
    await runner(api).run(s.tenant, run_id)
    values = await _values(api)
    assert all(values[i] != "" for i in swept)
    assert await Runner(api.runtime, SWEEP_JOBS, lease_seconds=0.01).pick_up() == 0
    enabled = await admin.http.post(
        f"/v1/tenants/{api.tenant_id}/enable", headers=admin.admin.headers
    )
    assert enabled.status_code == 200, enabled.text
    await runner(api).run(s.tenant, run_id)
    run = await run_of(api, run_id)
    assert (run["status"], run["counts"]["retracted"]) == ("finished", 4)
