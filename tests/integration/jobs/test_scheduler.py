"""The in-process worker of `serve`: it runs what the API queued, and queues scheduled jobs in
every tenant (never a second run of a job while one is queued or running)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from service.settings import JobSettings, Settings
from tests.conftest import make_settings
from tests.fixtures.api import Api
from tests.integration.jobs.support import expire, queue, run_of, scalar, setup

SWEEP_EVERY = 6.0
"""Long enough that the test's setup, writes, expiry and dry run fit between two scheduled
sweeps."""


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    schedule = (("memory.sweep_expired", SWEEP_EVERY), ("audit.checkpoint", 1.0))
    jobs = JobSettings(poll_seconds=0.1, batch_size=3, schedule=schedule)
    return replace(make_settings(database_url, tmp_path), jobs=jobs)


async def _until(api: Api, check: Any, seconds: float = 20.0) -> Any:
    """Poll the API (bounded) until `check()` answers something true."""
    for _ in range(int(seconds / 0.1)):
        found = await check()
        if found:
            return found
        await asyncio.sleep(0.1)
    pytest.fail("the worker did not get there in time")


async def test_the_worker_runs_queued_runs_and_schedules_the_sweep(api: Api) -> None:
    async def scheduled(*statuses: str, retracted: int | None = None) -> Any:
        listed = await api.http.get("/v1/jobs/runs", headers=api.admin.headers)
        return [
            run
            for run in listed.json()["items"]
            if run["enqueued_by"] is None
            and run["status"] in statuses
            and not run["dry_run"]
            and retracted in (None, run["counts"].get("retracted"))
        ]

    # The schedule's first sweep has ended (refused: the job principal holds no grant before
    # setup); the next is SWEEP_EVERY away, so the dry run below counts what expired before a
    # scheduled sweep retracts it.
    await _until(api, lambda: scheduled("finished", "refused"))
    s = await setup(api)
    old = [await api.remember(s.writer, key=f"old{i}", space_id=s.space_id) for i in range(4)]
    await expire(api, [m["id"] for m in old], days_ago=40)
    asked = await queue(api, "memory.sweep_expired", dry_run=True)
    dry = await _until(api, lambda: _ended(api, asked))
    assert (dry["status"], dry["counts"]["retracted"]) == ("finished", 4)

    [first, *_] = await _until(api, lambda: scheduled("finished", retracted=4))
    assert first["counts"]["retracted"] == 4
    listed = (await api.http.get("/v1/jobs/runs", headers=api.admin.headers)).json()["items"]
    pending = [
        r for r in listed if r["enqueued_by"] is None and r["status"] in ("queued", "running")
    ]
    assert len(pending) <= 1


async def _ended(api: Api, run_id: Any) -> Any:
    run = await run_of(api, run_id)
    return run if run["status"] not in ("queued", "running") else None


async def test_the_schedule_runs_platform_jobs_audited_in_the_platform_chain(api: Api) -> None:
    async def signed() -> Any:
        rows: int = await scalar(
            api.runtime,
            "SELECT count(*) FROM audit_events WHERE action = 'audit.sign_checkpoints' "
            "AND method = 'SCHEDULE' AND tenant_id = '00000000-0000-0000-0000-000000000000' "
            "AND decision = 'allow' AND reason LIKE 'ok signed=%'",
        )
        return rows

    assert await _until(api, signed) >= 1
