"""Request-rate and concurrency limits: they bite with 429 and the three headers, reset after
their window, are per tenant and per client, are audited as denials, change nothing, and cost
an unconfigured tenant no database work per request."""

from __future__ import annotations

import asyncio
import time

from sqlalchemy import event

from tests.fixtures.api import Api
from tests.integration.quotas.support import (
    assert_limited,
    audit_of,
    limit,
    principal_of,
    stored,
)

NOTE = {"subject": "service:billing", "kind": "fact", "key": "deploy.window", "value": "Tue"}


async def test_a_burst_above_the_tenant_rate_gets_429_with_headers_and_the_neighbour_does_not(
    api: Api,
) -> None:
    alice = await api.new_agent("alice")
    other = await api.other_tenant()
    bob = await other.new_agent("bob")
    await limit(api.runtime, api.tenant_id, requests_per_second=0.001, request_burst=3)
    answers = []
    neighbour = []
    for _ in range(6):
        answers.append(await api.http.get("/v1/memories", headers=alice.headers))
        neighbour.append(await api.http.get("/v1/memories", headers=bob.headers))
    assert [r.status_code for r in answers] == [200, 200, 200, 429, 429, 429]
    assert all(r.status_code == 200 for r in neighbour)
    body = assert_limited(answers[3], "tenant-requests", 3)
    assert body["type"].endswith("/rate-limited")
    assert answers[3].headers["ratelimit-policy"] == '"tenant-requests";q=3;w=3000'
    # Nothing another tenant could learn from: the answer names only the caller's own limit.
    assert other.tenant_id not in answers[3].text
    audited = await audit_of(api.runtime, api.tenant_id, 429)
    assert [(r["action"], r["reason"], r["decision"]) for r in audited] == [
        ("memory.list", "rate-limited", "deny")
    ] * 3
    assert await audit_of(api.runtime, other.tenant_id, 429) == []


async def test_a_refused_write_changes_nothing(api: Api) -> None:
    alice = await api.new_agent("alice")
    await limit(api.runtime, api.tenant_id, requests_per_second=0.001, request_burst=1)
    first = await api.http.post("/v1/memories", json=NOTE, headers=alice.headers)
    assert first.status_code == 201
    refused = await api.http.post(
        "/v1/memories", json=NOTE | {"key": "other"}, headers=alice.headers
    )
    assert_limited(refused, "tenant-requests", 1)
    assert await stored(api.runtime, api.tenant_id) == 1


async def test_the_bucket_refills_after_its_window(api: Api) -> None:
    alice = await api.new_agent("alice")
    # 0.5/s: the second request comes well within the 2 s a token takes, even on a slow host.
    await limit(api.runtime, api.tenant_id, requests_per_second=0.5, request_burst=1)
    assert (await api.http.get("/v1/memories", headers=alice.headers)).status_code == 200
    refused = await api.http.get("/v1/memories", headers=alice.headers)
    assert_limited(refused, "tenant-requests", 1)
    assert 1 <= int(refused.headers["retry-after"]) <= 2
    await asyncio.sleep(2.1)  # one token at 0.5/s
    assert (await api.http.get("/v1/memories", headers=alice.headers)).status_code == 200


async def test_a_client_limit_bites_that_client_only(api: Api) -> None:
    alice = await api.new_agent("alice")
    carol = await api.new_agent("carol")
    await limit(
        api.runtime, api.tenant_id, alice.client_id, requests_per_second=0.001, request_burst=2
    )
    statuses = [
        (await api.http.get("/v1/memories", headers=alice.headers)).status_code for _ in range(3)
    ]
    assert statuses == [200, 200, 429]
    refused = await api.http.get("/v1/memories", headers=alice.headers)
    assert_limited(refused, "client-requests", 2)
    for _ in range(5):
        assert (await api.http.get("/v1/memories", headers=carol.headers)).status_code == 200


async def test_a_tenant_refusal_gives_the_client_token_back(api: Api) -> None:
    alice = await api.new_agent("alice")
    await limit(
        api.runtime, api.tenant_id, alice.client_id, requests_per_second=0.001, request_burst=5
    )
    await limit(api.runtime, api.tenant_id, requests_per_second=0.001, request_burst=1)
    assert (await api.http.get("/v1/memories", headers=alice.headers)).status_code == 200
    assert_limited(await api.http.get("/v1/memories", headers=alice.headers), "tenant-requests", 1)


async def test_concurrent_requests_are_capped_and_slots_come_back(api: Api) -> None:
    alice = await api.new_agent("alice")
    await limit(api.runtime, api.tenant_id, concurrent_requests=1)
    # A request in flight (admitted, not yet finished) holds the tenant's one slot.
    held = await api.runtime.quotas.admit(principal_of(api, alice))
    assert held is not None
    refused = await api.http.get("/v1/memories", headers=alice.headers)
    body = assert_limited(refused, "tenant-concurrency", 1)
    assert body["window_seconds"] is None
    assert refused.headers["ratelimit-policy"] == '"tenant-concurrency";q=1'
    await held.release()
    for _ in range(3):  # each request gives its slot back when it ends
        assert (await api.http.get("/v1/memories", headers=alice.headers)).status_code == 200


async def test_a_client_concurrency_limit_leaves_other_clients_alone(api: Api) -> None:
    alice = await api.new_agent("alice")
    carol = await api.new_agent("carol")
    await limit(api.runtime, api.tenant_id, alice.client_id, concurrent_requests=1)
    held = await api.runtime.quotas.admit(principal_of(api, alice))
    assert held is not None
    assert_limited(
        await api.http.get("/v1/memories", headers=alice.headers), "client-concurrency", 1
    )
    assert (await api.http.get("/v1/memories", headers=carol.headers)).status_code == 200
    await held.release()


async def test_an_unconfigured_tenant_costs_no_quota_statement_per_request(api: Api) -> None:
    alice = await api.new_agent("alice")
    assert (await api.http.get("/v1/memories", headers=alice.headers)).status_code == 200
    sent: list[str] = []

    def count(*args: object) -> None:
        sent.append(str(args[2]))

    engine = api.runtime.quotas._engine.sync_engine
    event.listen(engine, "before_cursor_execute", count)
    try:
        for _ in range(10):
            assert (await api.http.get("/v1/memories", headers=alice.headers)).status_code == 200
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert sent == []


async def test_a_configured_rate_leases_batches_not_a_statement_per_request(api: Api) -> None:
    alice = await api.new_agent("alice")
    # 1,000/s with 0.1 s leases: batches of 16 (MEMGATE_QUOTA_LEASE_MAX), far above the burst.
    await limit(api.runtime, api.tenant_id, requests_per_second=1000, request_burst=1000)
    leases: list[str] = []

    def count(*args: object) -> None:
        if "quota_buckets" in str(args[2]):
            leases.append(str(args[2]))

    engine = api.runtime.quotas._engine.sync_engine
    event.listen(engine, "before_cursor_execute", count)
    started = time.monotonic()
    try:
        for _ in range(16):
            assert (await api.http.get("/v1/memories", headers=alice.headers)).status_code == 200
    finally:
        event.remove(engine, "before_cursor_execute", count)
    elapsed = time.monotonic() - started
    # One lease per lease period at most (a lease not spent in 0.1 s lapses), never one per
    # request: on this shared host a request takes tens of ms.
    lease_seconds = api.runtime.settings.quotas.lease_seconds
    assert 1 <= len(leases) <= min(15, elapsed / lease_seconds + 1), (len(leases), elapsed)
