"""memory.sweep_expired on the runner: what it deletes, what it keeps, and its audit rows."""

from __future__ import annotations

from tests.fixtures.api import Api
from tests.integration.jobs.support import (
    audit_rows,
    expire,
    queue,
    run_of,
    runner,
    setup,
    stored_ids,
)


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
