"""memory.sweep_expired on the runner: what it deletes, what it keeps, and its audit rows."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import text

from tests.fixtures.api import Api
from tests.integration.jobs.support import (
    Setup,
    audit_rows,
    expire,
    grant,
    new_space,
    queue,
    run_of,
    runner,
    setup,
    stored_ids,
)
from tests.integration.memory.support import as_owner, memory_rows
from tests.integration.tenants.support import platform


async def test_sweep_deletes_expired_rows_past_retention_in_batches(api: Api) -> None:
    s = await setup(api)
    old = [await api.remember(s.writer, key=f"old{i}", space_id=s.space_id) for i in range(7)]
    recent = await api.remember(s.writer, key="recent", space_id=s.space_id)
    alive = await api.remember(s.writer, key="alive", space_id=s.space_id)
    await expire(api, [m["id"] for m in old], days_ago=40)
    await expire(api, [recent["id"]], days_ago=5)  # inside the 30-day retention
    run_id = await queue(api, "memory.sweep_expired")
    await runner(api).run(s.tenant, run_id)
    run = await run_of(api, run_id)
    assert run["status"] == "finished", run
    assert run["counts"] == {"scanned": 7, "deleted": 0, "retracted": 7}
    assert run["batches"] == 3  # 3 + 3 + 1 with batches of 3
    stored = await stored_ids(api)
    assert {recent["id"], alive["id"]} <= stored
    rows = await audit_rows(api, "memory.sweep_expired", run_id)
    assert [r["result_count"] for r in rows] == [3, 3, 1]
    assert [r["reason"] for r in rows] == [
        "ok deleted=0,retracted=3,scanned=3",
        "ok deleted=0,retracted=3,scanned=3",
        "ok deleted=0,retracted=1,scanned=1",
    ]
    assert all(r["decision"] == "allow" and str(run_id) in r["t"] for r in rows)


async def _sweep(api: Api, s: Setup, **body: object) -> dict[str, Any]:
    run_id = await queue(api, "memory.sweep_expired", **body)
    await runner(api).run(s.tenant, run_id)
    run = await run_of(api, run_id)
    assert run["status"] == "finished", run
    return run


async def test_a_dry_run_counts_and_changes_nothing(api: Api) -> None:
    s = await setup(api)
    old = [await api.remember(s.writer, key=f"old{i}", space_id=s.space_id) for i in range(4)]
    await expire(api, [m["id"] for m in old], days_ago=40)
    before = await memory_rows(api.runtime)
    run = await _sweep(api, s, dry_run=True)
    assert run["counts"] == {"scanned": 4, "deleted": 0, "retracted": 4}
    assert await memory_rows(api.runtime) == before


async def test_old_versions_go_heads_become_stubs_and_readers_of_swept_ids_still_read(
    api: Api,
) -> None:
    s = await setup(api)
    first = await api.remember(s.writer, key="window", value="Tuesdays", space_id=s.space_id)
    second = await api.remember(s.writer, key="window", value="Thursdays", space_id=s.space_id)
    assert second["supersedes"] == first["id"]
    summary = await api.remember(
        s.writer,
        key="summary",
        kind="summary",
        value="deploys happen weekly",
        space_id=s.space_id,
        derived_from=[first["id"]],
    )
    gone = await api.remember(s.writer, key="gone", value="short-lived", space_id=s.space_id)
    await expire(api, [first["id"], gone["id"]], days_ago=40)
    run = await _sweep(api, s)
    assert run["counts"] == {"scanned": 2, "deleted": 1, "retracted": 1}
    stored = await stored_ids(api)
    assert first["id"] not in stored  # an old version: row, vector and lexemes gone
    [stub] = await memory_rows(api.runtime, "id = :id", id=gone["id"])
    assert (stub["value"], stub["embedding"], stub["retracted_at"] is not None) == ("", None, True)
    # Rows that name the swept id still read: the live head, its history, the summary.
    history = await api.http.get(f"/v1/memories/{second['id']}/history", headers=s.writer.headers)
    assert history.status_code == 200, history.text
    assert [item["id"] for item in history.json()["items"]] == [second["id"]]
    derived = await api.http.get(f"/v1/memories/{summary['id']}", headers=s.writer.headers)
    assert derived.status_code == 200, derived.text
    assert derived.json()["provenance"]["derived_from"] == []
    assert derived.json()["provenance"]["derived_from_withheld"] == 1
    # A second sweep finds nothing left to do.
    assert (await _sweep(api, s))["counts"] == {"scanned": 0, "deleted": 0, "retracted": 0}
    # The stub keeps its number: the key's next write does not issue it again; once it has a
    # successor, the stub is an old version like any other and goes.
    again = await api.remember(s.writer, key="gone", value="back again", space_id=s.space_id)
    assert again["version"] == gone["version"] + 1
    assert (await _sweep(api, s))["counts"] == {"scanned": 1, "deleted": 1, "retracted": 0}
    latest = await api.remember(s.writer, key="gone", value="once more", space_id=s.space_id)
    assert latest["version"] == gone["version"] + 2


async def test_revoked_rows_stay_as_tombstones(api: Api) -> None:
    s = await setup(api)
    revoked = await api.remember(
        s.writer, key="secret", value="do not relearn", space_id=s.space_id
    )
    async with as_owner(api.runtime) as conn:
        await conn.execute(
            text("UPDATE memories SET revoked_at = now() WHERE id = :id"), {"id": revoked["id"]}
        )
        await conn.commit()
    await expire(api, [revoked["id"]], days_ago=400)
    assert (await _sweep(api, s))["counts"]["scanned"] == 0
    [row] = await memory_rows(api.runtime, "id = :id", id=revoked["id"])
    assert row["content_hash"]  # the tombstone still stops the fact being learned again


async def test_the_tenants_retention_and_the_runs_space_bound_the_sweep(api: Api) -> None:
    s = await setup(api)
    other = await new_space(api, "other")
    for action in ("read", "write", "delete"):
        await grant(api, other, action, f"user:{s.writer.principal_id}")
    for action in ("read", "delete"):
        await grant(api, other, action, f"service:{s.job_principal}")
    forty = await api.remember(s.writer, key="forty", space_id=s.space_id)
    ninety = await api.remember(s.writer, key="ninety", space_id=s.space_id)
    elsewhere = await api.remember(s.writer, key="elsewhere", space_id=other)
    await expire(api, [forty["id"]], days_ago=40)
    await expire(api, [ninety["id"], elsewhere["id"]], days_ago=90)
    admin = await platform(api)
    patched = await admin.http.patch(
        f"/v1/tenants/{api.tenant_id}",
        json={"settings": {"retention_days": 60}},
        headers=admin.admin.headers,
    )
    assert patched.status_code == 200, patched.text
    run = await _sweep(api, s, space_id=s.space_id)
    assert run["counts"]["retracted"] == 1
    rows = {row["id"]: row for row in await memory_rows(api.runtime)}
    assert str(rows[uuid.UUID(ninety["id"])]["value"]) == ""
    assert rows[uuid.UUID(forty["id"])]["value"] != ""  # inside the tenant's 60 days
    assert rows[uuid.UUID(elsewhere["id"])]["value"] != ""  # another space than the run's
