"""Two replicas (two runtimes and apps on one database, as two `memgate serve` workers or pods):
a burst split across both gets exactly the configured number through (batches of one), or
within the documented bound (bigger batches); concurrency slots are shared, and a killed
replica's slots lapse."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
from litestar.testing import AsyncTestClient
from sqlalchemy import text

from service.app import create_app
from service.embeddings import Embedder
from service.runtime import Runtime, build_runtime
from service.settings import QuotaSettings, Settings
from tests.conftest import PUBLIC_URL, make_settings
from tests.fixtures.api import Agent, Api, TestClient
from tests.fixtures.postgres import app_login
from tests.integration.memory.support import as_owner
from tests.integration.quotas.support import assert_limited, limit, principal_of


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    # Leases live long enough here that a batch is spent within them on a loaded host.
    return replace(make_settings(database_url, tmp_path), quotas=QuotaSettings(lease_seconds=10.0))


@pytest.fixture
async def second(
    settings: Settings, embedder: Embedder
) -> AsyncIterator[tuple[Runtime, TestClient]]:
    """Another replica on the same database: its own pool, limiter and app."""
    built = await build_runtime(settings, app_login(settings.database.url), embedder)
    async with AsyncTestClient(app=create_app(built), base_url=PUBLIC_URL) as client:
        yield built, client
    await built.close()


async def _statuses(http: TestClient, agent: Agent, n: int) -> list[int]:
    return [(await http.get("/v1/memories", headers=agent.headers)).status_code for _ in range(n)]


async def test_a_burst_split_across_two_replicas_gets_exactly_the_burst_through(
    api: Api, second: tuple[Runtime, TestClient]
) -> None:
    _, other_replica = second
    alice = await api.new_agent("alice")
    # 0.001/s: a lease is one token (floor(rate x lease period) < 1), so no replica holds any
    # token it has not spent, and the count is exact.
    await limit(api.runtime, api.tenant_id, requests_per_second=0.001, request_burst=10)
    one, two = await asyncio.gather(
        _statuses(api.http, alice, 10), _statuses(other_replica, alice, 10)
    )
    assert (one + two).count(200) == 10
    assert (one + two).count(429) == 10
    # Either replica refuses from now on, and says so with the same policy.
    assert_limited(
        await other_replica.get("/v1/memories", headers=alice.headers), "tenant-requests", 10
    )
    assert_limited(await api.http.get("/v1/memories", headers=alice.headers), "tenant-requests", 10)


async def test_batched_leases_stay_within_the_documented_bound(
    api: Api, second: tuple[Runtime, TestClient]
) -> None:
    _, other_replica = second
    alice = await api.new_agent("alice")
    rate, burst = 0.5, 10
    # A lease takes floor(0.5 x 10 s) = 5 tokens: overshoot is bounded by rate x lease period
    # (5) beyond burst + rate x elapsed, whatever the number of replicas.
    await limit(api.runtime, api.tenant_id, requests_per_second=rate, request_burst=burst)
    started = time.monotonic()
    statuses: list[int] = []
    for _ in range(12):  # alternating replicas, one request at a time
        statuses += await _statuses(api.http, alice, 1)
        statuses += await _statuses(other_replica, alice, 1)
    elapsed = time.monotonic() - started
    admitted = statuses.count(200)
    # Both replicas spent their whole lease (they alternate), so nothing was stranded here.
    assert burst <= admitted <= burst + rate * elapsed + rate * 10.0, (admitted, elapsed)


async def test_concurrency_slots_are_shared_by_replicas_and_a_dead_replicas_slots_lapse(
    api: Api, second: tuple[Runtime, TestClient]
) -> None:
    other_runtime, other_replica = second
    alice = await api.new_agent("alice")
    await limit(api.runtime, api.tenant_id, concurrent_requests=1)
    principal = principal_of(api, alice)
    held = await other_runtime.quotas.admit(principal)  # in flight on the other replica
    assert held is not None
    assert_limited(
        await api.http.get("/v1/memories", headers=alice.headers), "tenant-concurrency", 1
    )
    await held.release()
    assert (await api.http.get("/v1/memories", headers=alice.headers)).status_code == 200
    assert (await other_replica.get("/v1/memories", headers=alice.headers)).status_code == 200
    # A replica that was killed with a slot held: counted until its expiry, then not.
    dead = uuid.uuid4()
    async with as_owner(api.runtime) as conn:
        await conn.execute(
            text("INSERT INTO quota_slots VALUES (:t, '', :r, 1, now() + interval '1 hour')"),
            {"t": api.tenant_id, "r": dead},
        )
        await conn.commit()
    assert_limited(
        await api.http.get("/v1/memories", headers=alice.headers), "tenant-concurrency", 1
    )
    async with as_owner(api.runtime) as conn:
        await conn.execute(
            text(
                "UPDATE quota_slots SET expires_at = now() - interval '1 second' WHERE replica = :r"
            ),
            {"r": dead},
        )
        await conn.commit()
    assert (await api.http.get("/v1/memories", headers=alice.headers)).status_code == 200
