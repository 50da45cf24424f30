"""A noisy neighbour against a quiet tenant's latency, with and without the noisy one's limit.

    .venv/bin/python -m bench.noisy_neighbour [--reads 60] [--burst 2000] [--concurrency 16]
                                              [--seconds 10] [--offered 100]

Starts its own embedded PostgreSQL (or uses DATABASE_URL), serves the real app with uvicorn on
127.0.0.1 (a free port), and over real sockets measures tenant B's reads (`GET /v1/memories`,
one at a time) in four phases:

1. baseline: nobody else is calling;
2. B limited: B under a generous rate limit of its own (what a configured limit costs a
   request that passes it: leases from the bucket row, not a statement per request);
3. A bursts, limited: for `--seconds`, tenant A sends requests `--concurrency` at once (at
   most `--burst` in all), far above its limit of 20 requests/s (burst 20); the rest are
   refused 429 at the entrance (after the token check, audited, before any work);
4. A bursts, unlimited: the same with A's limit removed, for comparison;
5. and 6. the same two with an open-loop burst instead: A sends `--offered` requests a second
   on a fixed schedule (five times its limit by default), whatever the answers, as a client
   that does not wait for the one before (an answer later than twice `--seconds` is status 0).

B reads for as long as A bursts. Prints B's p50/p95/max per phase, A's answers, and the
limiter's statements (leases, slot claims). All bounded: at most `--burst` requests of A, each
phase `--seconds` long. Server and clients share one event
loop and the machine's cores, as they would in one replica.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import statistics
import time
import uuid
from typing import Any, cast

import httpx
import uvicorn
from sqlalchemy import event

from bench.api import agent_credentials, bearer, new_runtime
from bench.database import bench_database
from bench.token_flood import _free_port
from service.app import create_app
from service.auth.issuer import issued_claims
from service.quotas.schemas import Limits
from service.quotas.service import set_limits
from service.runtime import Runtime

NOTE = {"subject": "service:x", "kind": "fact", "key": "k", "value": "a note"}


def _tenant_of(headers: dict[str, str]) -> uuid.UUID:
    """The tenant our own token names (it was just issued to us: no need to verify it)."""
    return uuid.UUID(issued_claims(headers["Authorization"].split()[1])["tenant"])


async def _limit(runtime: Runtime, tenant: uuid.UUID, limits: Limits) -> None:
    async with runtime.sessionmaker.begin() as session:
        await set_limits(session, tenant, limits)
    runtime.quotas.forget(tenant)


def _summary(samples: list[float]) -> tuple[float, float, str]:
    ms = sorted(s * 1000 for s in samples)
    p50 = statistics.median(ms)
    p95 = ms[min(len(ms) - 1, round(0.95 * (len(ms) - 1)))]
    return p50, p95, f"p50 {p50:7.1f} ms  p95 {p95:7.1f} ms  max {ms[-1]:7.1f} ms  (n={len(ms)})"


async def _reads(
    http: httpx.AsyncClient, headers: dict[str, str], count: int, until: asyncio.Event | None
) -> tuple[list[float], collections.Counter[int]]:
    samples: list[float] = []
    statuses: collections.Counter[int] = collections.Counter()
    while len(samples) < count or (until is not None and not until.is_set()):
        started = time.perf_counter()
        response = await http.get("/v1/memories", headers=headers)
        samples.append(time.perf_counter() - started)
        statuses[response.status_code] += 1
    return samples, statuses


async def _burst(
    base: str, headers: dict[str, str], total: int, concurrency: int, seconds: float
) -> collections.Counter[int]:
    """Up to `total` requests, `concurrency` at once, for `seconds`."""
    statuses: collections.Counter[int] = collections.Counter()
    queue = iter(range(total))
    deadline = time.monotonic() + seconds
    async with httpx.AsyncClient(base_url=base, timeout=seconds * 2) as http:

        async def worker() -> None:
            for _ in queue:
                if time.monotonic() > deadline:
                    return
                response = await http.get("/v1/memories", headers=headers)
                statuses[response.status_code] += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return statuses


async def _offered(
    base: str, headers: dict[str, str], rate: float, total: int, seconds: float
) -> collections.Counter[int]:
    """An open-loop burst: `rate` requests a second on a fixed schedule, whatever the answers
    (a client that does not wait for the one before), at most `total`, for `seconds`. A request
    that gets no answer within twice `seconds` counts as status 0."""
    statuses: collections.Counter[int] = collections.Counter()
    async with httpx.AsyncClient(
        base_url=base, timeout=seconds * 2, limits=httpx.Limits(max_connections=None)
    ) as http:

        async def one() -> None:
            try:
                response = await http.get("/v1/memories", headers=headers)
                statuses[response.status_code] += 1
            except httpx.HTTPError:
                statuses[0] += 1

        tasks: list[asyncio.Task[None]] = []
        start = time.monotonic()
        for i in range(min(total, int(rate * seconds))):
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one()))
        await asyncio.gather(*tasks)
    return statuses


def _print_rows(
    rows: list[tuple[str, str, str]], concurrency: int, seconds: float, offered: float
) -> None:
    print(
        f"B's reads, one at a time; A: {concurrency} at once for {seconds:g} s, then "
        f"{offered:g} requests/s on a fixed schedule (limit 20/s, burst 20)"
    )
    for name, summary, extra in rows:
        print(f"{name:<26} {summary}  {extra}")


async def run(
    url: str, reads: int, burst: int, concurrency: int, seconds: float, offered: float
) -> None:
    runtime = await new_runtime(url)
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    config = uvicorn.Config(
        cast(Any, create_app(runtime)), host="127.0.0.1", port=port, log_level="error"
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    while not server.started:  # noqa: ASYNC110 (uvicorn has no event)
        await asyncio.sleep(0.05)
    statements: list[str] = []
    event.listen(
        runtime.quotas._engine.sync_engine,
        "before_cursor_execute",
        lambda *args: statements.append(str(args[2])),
    )
    try:
        async with httpx.AsyncClient(base_url=base, timeout=seconds * 4) as http:
            noisy = await bearer(http, await agent_credentials(http, runtime))  # tenant A
            quiet = await bearer(http, await agent_credentials(http, runtime))  # tenant B
            tenant_a, tenant_b = _tenant_of(noisy), _tenant_of(quiet)
            for headers in (noisy, quiet):
                await http.post("/v1/memories", json=NOTE, headers=headers)
            await _reads(http, quiet, 10, None)  # warm up
            rows: list[tuple[str, str, str]] = []

            async def phase(name: str, noisy_limited: bool | None, open_loop: bool = False) -> None:
                statements.clear()
                if noisy_limited is None:
                    samples, _ = await _reads(http, quiet, reads, None)
                    counted = f"limiter statements {len(statements)}"
                    rows.append((name, _summary(samples)[2], counted))
                    return
                limits = Limits(requests_per_second=20, request_burst=20)
                await _limit(runtime, tenant_a, limits if noisy_limited else Limits())
                await asyncio.sleep(1.0)  # A's bucket full again
                done = asyncio.Event()
                load = (
                    _offered(base, noisy, offered, burst, seconds)
                    if open_loop
                    else _burst(base, noisy, burst, concurrency, seconds)
                )
                task = asyncio.create_task(load)
                task.add_done_callback(lambda _: done.set())
                async with asyncio.timeout(seconds * 4):
                    samples, quiet_statuses = await _reads(http, quiet, reads, done)
                    answers = await task
                codes = " ".join(f"{c}:{n}" for c, n in sorted(answers.items()))
                bad = {c: n for c, n in quiet_statuses.items() if c != 200}
                rows.append(
                    (
                        name,
                        _summary(samples)[2],
                        f"A's answers {codes}; limiter statements {len(statements)}"
                        + (f"; B not 200: {bad}" if bad else ""),
                    )
                )

            await phase("baseline", None)
            await _limit(runtime, tenant_b, Limits(requests_per_second=1000, request_burst=1000))
            await phase("B limited (1000/s)", None)
            await _limit(runtime, tenant_b, Limits())
            for name, limited, open_loop in (
                ("A bursts, limited", True, False),
                ("A bursts, unlimited", False, False),
                (f"A offers {offered:g}/s, limited", True, True),
                (f"A offers {offered:g}/s, unlimited", False, True),
            ):
                await phase(name, limited, open_loop)
            _print_rows(rows, concurrency, seconds, offered)
    finally:
        server.should_exit = True
        await serving
        await runtime.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reads", type=int, default=60, help="B's reads per phase (at least)")
    parser.add_argument("--burst", type=int, default=2000, help="most requests of A per phase")
    parser.add_argument("--concurrency", type=int, default=16, help="A's requests at once")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of a burst phase")
    parser.add_argument(
        "--offered", type=float, default=100.0, help="A's open-loop rate (requests/s)"
    )
    args = parser.parse_args()
    with bench_database() as url:
        asyncio.run(run(url, args.reads, args.burst, args.concurrency, args.seconds, args.offered))


if __name__ == "__main__":
    main()
