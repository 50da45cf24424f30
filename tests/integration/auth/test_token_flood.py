"""Review item 1: unauthenticated token requests must not exhaust the pool other tenants need.

Wrong-secret requests used to check a pooled connection out and hold it while they queued for
one of the two argon2 slots, so a few dozen of them starved every other tenant's reads. Now the
client row is read in a session closed before the hash wait, failed authentications are limited
per client id and per source, and token requests in flight are bounded (429/503 with
Retry-After past them). Floods here are bounded in count and time.
"""

from __future__ import annotations

import asyncio
import statistics

from service.runtime import Runtime
from tests.fixtures.api import Api
from tests.integration.auth.throttling import (
    FLOOD_SECONDS,
    assert_retry_later,
    concurrent_client,
    peak_checked_out,
    timed_reads,
    wrong_secret,
)


async def test_a_wrong_secret_flood_leaves_other_tenants_reads_alone(
    api: Api, runtime: Runtime
) -> None:
    """Default limits. 60 concurrent wrong-secret requests against a live client: the pool is
    never exhausted, another tenant's reads stay within a small factor of their baseline, and
    no flood answer is a 500."""
    victim = await api.new_agent("victim")
    other = await api.other_tenant()
    reader = await other.new_agent("reader")
    await other.remember(reader, key="r.note", value="a note to list")
    async with concurrent_client(runtime) as http:
        await timed_reads(http, reader.headers, 5)  # warm up
        baseline = statistics.median(await timed_reads(http, reader.headers, 20))
        stop = asyncio.Event()
        sampler = asyncio.create_task(peak_checked_out(runtime.engine, stop))
        async with asyncio.timeout(FLOOD_SECONDS):
            flood = asyncio.gather(*(wrong_secret(http, victim.client_id) for _ in range(60)))
            during = await timed_reads(http, reader.headers, 20)
            answers = await flood
        stop.set()
        peak = await sampler

    capacity = 2 * runtime.settings.database.pool_size
    assert peak < capacity, (peak, capacity)
    median = statistics.median(during)
    assert median <= max(5 * baseline, baseline + 0.15), (baseline, median)
    statuses = [answer.status_code for answer in answers]
    assert set(statuses) <= {401, 429, 503}, statuses
    assert statuses.count(401) <= runtime.settings.auth.token_failure_burst
    for answer in answers:
        if answer.status_code == 429:
            assert_retry_later(answer, 429, "oauth-too-many-failures")
