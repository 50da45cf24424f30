"""The client against a real server over TCP: tokens replaced before they expire and once when
the server rejects one, one refresh for many concurrent callers, token exchange, retries after
a dropped connection for reads only, and a plain write never sent twice."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import httpx
import pytest
from memgate_client import (
    AsyncMemgate,
    ClientCredentials,
    Credentials,
    Memgate,
    MemgateConnectionError,
    RateLimited,
    RetryPolicy,
    TokenExchange,
)
from memgate_client.types import MemoryCreate

from tests.integration.client.conftest import QUICK, TOKEN_TTL, DroppingProxy, Tenant

TOKEN_PATH = "/oauth/token"


class Seen:
    """What the client sent and what came back: (method, path, status) per answer."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, int]] = []

    def note(self, response: httpx.Response) -> None:
        self.calls.append(
            (response.request.method, response.request.url.path, response.status_code)
        )

    async def anote(self, response: httpx.Response) -> None:
        self.note(response)

    def paths(self) -> list[tuple[str, int]]:
        return [(path, status) for _, path, status in self.calls]


def watched(
    tenant: Tenant,
    seen: Seen,
    credentials: Credentials,
    clock: Callable[[], float] = time.monotonic,
) -> AsyncMemgate:
    http = httpx.AsyncClient(event_hooks={"response": [seen.anote]}, timeout=30)
    return AsyncMemgate(
        tenant.base_url, credentials=credentials, retry=QUICK, http=http, clock=clock
    )


async def test_a_token_is_replaced_before_it_expires(tenant: Tenant) -> None:
    agent = await tenant.agent("refresh")
    seen = Seen()
    async with watched(tenant, seen, credentials=agent.credentials()) as mg:
        await mg.list_memories(limit=1)
        await asyncio.sleep(TOKEN_TTL - 1.4)  # past the refresh point, before the expiry
        await mg.list_memories(limit=1)
        await mg.list_memories(limit=1)
    assert seen.paths() == [
        (TOKEN_PATH, 200),
        ("/v1/memories", 200),
        (TOKEN_PATH, 200),  # replaced ahead of time: no 401 on the way
        ("/v1/memories", 200),
        ("/v1/memories", 200),
    ]


async def test_a_token_the_server_rejects_is_replaced_once(tenant: Tenant) -> None:
    """A client whose clock stands still (or runs slow) thinks its token is fresh; the server
    says 401 invalid_token once it expired, and the client gets a new one and sends again."""
    agent = await tenant.agent("skewed")
    seen = Seen()
    async with watched(tenant, seen, credentials=agent.credentials(), clock=lambda: 0.0) as mg:
        first = await mg.write_memory(subject="service:skew", kind="fact", key="k", value="one")
        await asyncio.sleep(TOKEN_TTL + 0.1)
        second = await mg.get_memory(first["memory"]["id"])
    assert second["value"] == "one"
    assert seen.paths() == [
        (TOKEN_PATH, 200),
        ("/v1/memories", 201),
        (f"/v1/memories/{first['memory']['id']}", 401),
        (TOKEN_PATH, 200),
        (f"/v1/memories/{first['memory']['id']}", 200),
    ]


async def test_concurrent_callers_share_one_token_request(tenant: Tenant) -> None:
    agent = await tenant.agent("crowd")
    seen = Seen()
    async with watched(tenant, seen, credentials=agent.credentials()) as mg:
        pages = await asyncio.gather(*(mg.list_memories(limit=1) for _ in range(8)))
    assert len(pages) == 8
    assert [path for path, _ in seen.paths()].count(TOKEN_PATH) == 1

    sync_seen = Seen()
    http = httpx.Client(event_hooks={"response": [sync_seen.note]}, timeout=30)
    sync = Memgate(tenant.base_url, credentials=agent.credentials(), retry=QUICK, http=http)
    barrier = threading.Barrier(6)

    def call() -> None:
        barrier.wait()
        sync.list_memories(limit=1)

    def crowd() -> None:
        threads = [threading.Thread(target=call) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)

    await asyncio.to_thread(crowd)
    await asyncio.to_thread(http.close)
    assert [path for path, _ in sync_seen.paths()] == [TOKEN_PATH] + ["/v1/memories"] * 6


async def test_token_exchange_acts_for_the_user_and_follows_its_token(tenant: Tenant) -> None:
    user = await tenant.agent("ada", ["read:memory", "write:memory"])
    agent = await tenant.agent("ada-agent", ["read:memory", "write:memory"], kind="agent")
    async with tenant.client() as admin:
        await admin.allow_delegate(user.principal_id, agent.principal_id)
        # The token sees what both may see: a space shared by the user and the agent.
        space = (await admin.create_space(name="ada-and-agent"))["space"]["id"]
        for subject in (f"user:{user.principal_id}", f"agent:{agent.principal_id}"):
            for action in ("read", "write"):
                await admin.grant_space_access(space, action, subject)
    agent_client = agent.created["client"]
    exchange = TokenExchange(
        agent_client["client_id"],
        agent.created["client_secret"],
        user.credentials(),
        "write:memory read:memory",
    )
    seen = Seen()
    async with watched(tenant, seen, credentials=exchange) as mg:
        written = await mg.write_memory(
            subject="user:ada", kind="preference", key="tea", value="green", space_id=space
        )
        await asyncio.sleep(TOKEN_TTL - 1.4)
        again = await mg.get_memory(written["memory"]["id"])
        issued = await mg.issue_token()
    provenance = again["provenance"]
    assert provenance["writer_id"] == user.principal_id
    assert provenance["act"] == {"sub": agent.principal_id}
    assert issued["scope"] == "read:memory write:memory"
    # The user's token, then the exchange; both again once the exchanged one (which lives no
    # longer than the user's) was due; issue_token exchanges the still fresh user token.
    memory_path = f"/v1/memories/{written['memory']['id']}"
    assert [path for path, _ in seen.paths()] == [
        TOKEN_PATH,
        TOKEN_PATH,
        "/v1/memories",
        TOKEN_PATH,
        TOKEN_PATH,
        memory_path,
        TOKEN_PATH,
    ]
    assert all(status < 400 for _, status in seen.paths())


async def test_a_read_is_retried_after_a_dropped_connection(
    tenant: Tenant, proxy: DroppingProxy
) -> None:
    agent = await tenant.agent("dropped-read")
    async with AsyncMemgate(proxy.url, credentials=agent.credentials(), retry=QUICK) as mg:
        written = await mg.write_memory(subject="service:net", kind="fact", key="read", value="v")
        memory_id = written["memory"]["id"]
        for when in ("before", "after"):
            proxy.drop(1, when)
            assert (await mg.get_memory(memory_id))["id"] == memory_id
            assert proxy.dropped == 1
        proxy.drop(5, "before")  # more drops than attempts: the error, after QUICK's three
        with pytest.raises(MemgateConnectionError) as raised:
            await mg.get_memory(memory_id)
        assert proxy.dropped == QUICK.attempts
        assert isinstance(raised.value.__cause__, httpx.TransportError)
        proxy.drop(0, "before")


async def test_a_plain_write_is_never_sent_twice(tenant: Tenant, proxy: DroppingProxy) -> None:
    """The answer of a write was lost after the server wrote it: resending would write it
    twice, so the client raises and the caller decides (the batch write carries a key)."""
    agent = await tenant.agent("dropped-write")
    async with AsyncMemgate(proxy.url, credentials=agent.credentials(), retry=QUICK) as mg:
        await mg.list_memories(limit=1)  # the token, fetched before the drops
        for when, key in (("after", "lost-answer"), ("before", "never-sent")):
            proxy.drop(1, when)
            with pytest.raises(MemgateConnectionError):
                await mg.write_memory(subject="service:net", kind="fact", key=key, value="once")
            assert proxy.dropped == 1
        stored = {
            when: await mg.count_memories(key=key)
            for when, key in (("after", "lost-answer"), ("before", "never-sent"))
        }
    assert {when: counts["total"] for when, counts in stored.items()} == {"after": 1, "before": 0}


async def test_a_batch_whose_answer_was_lost_is_resent_under_its_key_and_written_once(
    tenant: Tenant, proxy: DroppingProxy
) -> None:
    """The server wrote the batch, the answer was lost: the client resends it under the same
    Idempotency-Key and gets the stored answer, so each memory exists once, at version 1."""
    agent = await tenant.agent("dropped-batch")
    items: list[MemoryCreate] = [  # new keys on purpose: the write gate asks otherwise
        {"subject": "service:batch", "kind": "fact", "key": f"batch.{n}", "value": f"item {n}",
         "new_key": True}
        for n in range(3)
    ]  # fmt: skip
    async with AsyncMemgate(proxy.url, credentials=agent.credentials(), retry=QUICK) as mg:
        await mg.list_memories(limit=1)  # the token, fetched before the drop
        proxy.drop(1, "after")
        written = await mg.write_memory_batch(items=items)
        assert proxy.dropped == 1
        assert written["count"] == 3
        assert [one["memory"]["key"] for one in written["items"]] == [i["key"] for i in items]
        for item in items:
            counts = await mg.count_memories(key=item["key"])
            assert counts["total"] == 1
        page = await mg.list_memories(subject="service:batch", limit=50)
        versions = {m["key"]: m["version"] for m in page["items"] if m["key"].startswith("batch.")}
    assert versions == {"batch.0": 1, "batch.1": 1, "batch.2": 1}


async def test_the_sync_client_retries_too(tenant: Tenant, proxy: DroppingProxy) -> None:
    """Run in a thread: the server shares this test's event loop."""
    agent = await tenant.agent("sync-drop")

    def calls() -> int:
        with Memgate(proxy.url, credentials=agent.credentials(), retry=QUICK) as mg:
            mg.list_memories(limit=1)
            proxy.drop(2, "before")
            return mg.count_memories()["total"]

    assert await asyncio.to_thread(calls) == 0
    assert proxy.dropped == 2


async def test_a_rate_limit_is_waited_out_for_reads_and_raised_for_writes(
    tenant: Tenant, platform: ClientCredentials
) -> None:
    agent = await tenant.agent("limited")
    client_id = agent.created["client"]["client_id"]
    async with AsyncMemgate(tenant.base_url, credentials=platform, retry=QUICK) as operator:
        limits = await operator.set_client_limits(
            tenant.tenant_id, client_id, requests_per_second=1, request_burst=1
        )
    assert limits["requests_per_second"] == 1
    # Retry-After beyond what this policy waits: raised. Its token is fetched first (token
    # requests are not API calls), so its call comes right after the others.
    impatient = AsyncMemgate(
        tenant.base_url,
        credentials=agent.credentials(),
        retry=RetryPolicy(attempts=3, max_retry_after=0.5),
    )
    await impatient.issue_token()
    seen = Seen()
    async with watched(tenant, seen, agent.credentials()) as mg:
        await mg.list_memories(limit=1)
        started = time.monotonic()
        await mg.list_memories(limit=1)  # 429 with Retry-After: 1, then the answer
        waited = time.monotonic() - started
        with pytest.raises(RateLimited) as refused:
            await mg.write_memory(subject="service:rl", kind="fact", key="k", value="v")
    async with impatient:
        with pytest.raises(RateLimited):
            await impatient.list_memories(limit=1)
    statuses = [status for path, status in seen.paths() if path == "/v1/memories"]
    assert statuses == [200, 429, 200, 429]  # the write was not sent again
    assert waited >= 1.0
    problem = refused.value
    assert (problem.status, problem.slug, problem.extensions["limit"]) == (
        429,
        "rate-limited",
        "client-requests",
    )
    assert problem.retry_after is not None
    assert problem.retry_after >= 1
    assert problem.headers["ratelimit-policy"] == '"client-requests";q=1;w=1'
