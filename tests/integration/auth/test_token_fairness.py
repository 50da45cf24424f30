"""Red-team findings 4 and 5 on the token endpoint's limits (review item 1).

4: one token was taken from each failure bucket up front, so concurrent requests with the
RIGHT secret were answered 429 `oauth-too-many-failures` (ten 200s and five 429s out of 15),
and so was another client of the same address that never failed.
5: a few sources could fill the process-wide in-flight bound, so other tenants got 503.

Real concurrent requests over httpx's ASGI transport, each transport with its own source
address; every loop is bounded in count and time."""

from __future__ import annotations

import asyncio
import collections
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast

import httpx

from service.app import create_app
from service.runtime import Runtime
from tests.conftest import PUBLIC_URL
from tests.fixtures.api import Agent, Api
from tests.integration.auth.throttling import FLOOD_SECONDS, FORM, assert_retry_later


@asynccontextmanager
async def from_address(runtime: Runtime, address: str) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=cast(Any, create_app(runtime)), client=(address, 40000))
    async with httpx.AsyncClient(transport=transport, base_url=PUBLIC_URL) as client:
        yield client


async def _token(
    http: httpx.AsyncClient, agent: Agent, secret: str | None = None
) -> httpx.Response:
    response: httpx.Response = await http.post(
        "/oauth/token", data=FORM, auth=(agent.client_id, secret or agent.secret)
    )
    return response


async def test_concurrent_right_secrets_are_never_called_failures(api: Api) -> None:
    busy = await api.new_agent("busy")
    bystander = await api.new_agent("bystander")
    async with from_address(api.runtime, "192.0.2.10") as http, asyncio.timeout(FLOOD_SECONDS):
        answers = await asyncio.gather(
            *(_token(http, busy) for _ in range(15)), _token(http, bystander)
        )
        statuses = collections.Counter(answer.status_code for answer in answers)
        # Nothing failed, so nothing is "too many failures": what does not fit in the client
        # id's share of the in-flight bound is told to come back in a second.
        assert 429 not in statuses, [answer.text for answer in answers]
        assert statuses[200] >= api.runtime.settings.auth.token_max_in_flight_per_client
        assert set(statuses) <= {200, 503}, statuses
        for answer in answers:
            if answer.status_code == 503:
                assert_retry_later(answer, 503, "oauth-overloaded")
        # The other client of that address got its token during the burst.
        assert answers[-1].status_code == 200, answers[-1].text
        # And the failure allowance of the client and the source is whole afterwards: the
        # burst's worth of wrong secrets are each checked (401), only then 429.
        burst = api.runtime.settings.auth.token_failure_burst
        wrong = [(await _token(http, busy, "mgs_wrong")).status_code for _ in range(burst + 1)]
    assert wrong == [401] * burst + [429], wrong


async def test_a_few_busy_sources_cannot_take_the_in_flight_bound_from_others(
    api: Api,
) -> None:
    """Three valid clients from three addresses, eight workers each, keep asking for tokens
    while a victim from a fourth address asks 20 times, one at a time: with a share per
    client id (and per source) they hold at most 12 of the 16 places, so the victim never
    gets 503. Then one address floods with random client ids: it holds at most its share."""
    attackers = [await api.new_agent(f"attacker{n}") for n in range(3)]
    victim = await api.new_agent("victim")
    done = asyncio.Event()

    async def worker(http: httpx.AsyncClient, agent: Agent) -> collections.Counter[int]:
        seen: collections.Counter[int] = collections.Counter()
        for _ in range(25):  # bounded, and stops when the victim is done
            if done.is_set():
                break
            status = (await _token(http, agent)).status_code
            seen[status] += 1
            if status == 503:
                await asyncio.sleep(0.02)
        return seen

    async with (
        from_address(api.runtime, "198.51.100.1") as a,
        from_address(api.runtime, "198.51.100.2") as b,
        from_address(api.runtime, "198.51.100.3") as c,
        from_address(api.runtime, "203.0.113.50") as mine,
        asyncio.timeout(FLOOD_SECONDS),
    ):
        workers = [
            asyncio.create_task(worker(http, agent))
            for http, agent in zip((a, b, c), attackers, strict=True)
            for _ in range(8)
        ]
        await asyncio.sleep(0.05)  # the workers are in flight
        victim_statuses = []
        for _ in range(20):
            victim_statuses.append((await _token(mine, victim)).status_code)
        done.set()
        seen = sum((await asyncio.gather(*workers)), collections.Counter[int]())
        assert victim_statuses == [200] * 20, (victim_statuses, seen)
        assert seen[503] > 0, seen  # the workers really asked for more than their share
        assert 429 not in seen, seen

        flood = asyncio.gather(
            *(
                a.post("/oauth/token", data=FORM, auth=(str(uuid.uuid4()), "mgs_wrong"))
                for _ in range(20)
            )
        )
        await asyncio.sleep(0)
        mine_during = await _token(mine, victim)
        flooded = collections.Counter(answer.status_code for answer in await flood)
    assert mine_during.status_code == 200, mine_during.text
    assert flooded[401] <= api.runtime.settings.auth.token_max_in_flight_per_source, flooded
    assert set(flooded) <= {401, 503}, flooded
