"""Wrong-secret floods at /oauth/token against another tenant's reads (review item 1).

    .venv/bin/python -m bench.token_flood [--floods 60,250] [--reads 40] [--seconds 60]

Starts its own embedded PostgreSQL (or uses DATABASE_URL), serves the real app with uvicorn on
127.0.0.1 (a free port), and over real sockets measures one tenant's authenticated reads
(`GET /v1/memories`, one at a time) at baseline and while N concurrent token requests with a
wrong secret for a live client of another tenant are in flight. Prints read latency (median,
p95, max), the flood's status codes, how long it took, and the pool's peak use (checked-out
connections, sampled every 2 ms; the pool holds `2 * MEMGATE_DB_POOL_SIZE`). Everything is
bounded: N requests, each flood and its reads within `--seconds`. Server, flood and reader
share one event loop and the machine's cores, as they would in one replica.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import socket
import statistics
import time
from collections.abc import Callable
from typing import Any, cast

import httpx
import uvicorn
from sqlalchemy.pool import QueuePool

from bench.api import FORM, agent_credentials, bearer, new_runtime
from bench.database import bench_database
from service.app import create_app
from service.runtime import Runtime


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _summary(samples: list[float]) -> str:
    if not samples:
        return "no read finished"
    ms = sorted(s * 1000 for s in samples)
    p95 = ms[min(len(ms) - 1, round(0.95 * (len(ms) - 1)))]
    return (
        f"median {statistics.median(ms):8.1f} ms  p95 {p95:8.1f} ms  max {ms[-1]:8.1f} ms  "
        f"(n={len(ms)})"
    )


async def _reads(
    http: httpx.AsyncClient, headers: dict[str, str], count: int, until: asyncio.Event | None
) -> tuple[list[float], collections.Counter[str]]:
    """`count` reads one after another (and, with `until`, on until it is set)."""
    samples: list[float] = []
    statuses: collections.Counter[str] = collections.Counter()
    done = 0
    while done < count or (until is not None and not until.is_set()):
        started = time.perf_counter()
        try:
            response = await http.get("/v1/memories", headers=headers)
            statuses[str(response.status_code)] += 1
            if response.status_code == 200:
                samples.append(time.perf_counter() - started)
        except httpx.HTTPError as exc:
            statuses[type(exc).__name__] += 1
        done += 1
        if until is not None and until.is_set() and done >= count:
            break
    return samples, statuses


async def _peak(runtime: Runtime, stop: asyncio.Event) -> int:
    peak = 0
    while not stop.is_set():
        peak = max(peak, cast(QueuePool, runtime.engine.pool).checkedout())
        await asyncio.sleep(0.002)
    return peak


async def _flood(
    base: str, client_id: str, n: int, seconds: float
) -> tuple[collections.Counter[str], float, float]:
    """N concurrent wrong-secret token requests: status counts, and the wall time of the
    flood and the median time of one of its answers."""
    limits = httpx.Limits(max_connections=n + 10, max_keepalive_connections=n + 10)
    statuses: collections.Counter[str] = collections.Counter()
    answer_times: list[float] = []
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=seconds) as flood:

        async def one() -> None:
            started = time.perf_counter()
            try:
                response = await flood.post(
                    "/oauth/token", data=FORM, auth=(client_id, "mgs_wrong-secret")
                )
                statuses[str(response.status_code)] += 1
            except httpx.HTTPError as exc:
                statuses[type(exc).__name__] += 1
            answer_times.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(n)))
    return statuses, time.perf_counter() - started, statistics.median(answer_times)


def _setter(event: asyncio.Event) -> Callable[[object], None]:
    return lambda _: event.set()


async def run(url: str, floods: list[int], reads: int, seconds: float) -> None:
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
    pool = 2 * runtime.settings.database.pool_size
    print(f"pool: {pool} connections; reads: GET /v1/memories of another tenant, one at a time")
    try:
        async with httpx.AsyncClient(base_url=base, timeout=seconds) as http:
            victim = await agent_credentials(http, runtime)  # tenant A: the flood's target
            reader = await bearer(http, await agent_credentials(http, runtime))  # tenant B
            await http.post(
                "/v1/memories",
                json={"subject": "service:x", "kind": "fact", "key": "k", "value": "a note"},
                headers=reader,
            )
            await _reads(http, reader, 10, None)  # warm up
            baseline, _ = await _reads(http, reader, reads, None)
            print(f"{'baseline':<12} reads {_summary(baseline)}")
            for n in floods:
                await asyncio.sleep(7.0)  # let failure allowances from the last flood come back
                stop, flood_done = asyncio.Event(), asyncio.Event()
                sampler = asyncio.create_task(_peak(runtime, stop))
                flood_task = asyncio.create_task(_flood(base, victim[0], n, seconds))
                flood_task.add_done_callback(_setter(flood_done))
                async with asyncio.timeout(seconds * 2):
                    during, read_statuses = await _reads(http, reader, reads, flood_done)
                    statuses, took, answer = await flood_task
                stop.set()
                peak = await sampler
                codes = " ".join(f"{code}:{count}" for code, count in sorted(statuses.items()))
                print(
                    f"flood N={n:<5} reads {_summary(during)}  ratio "
                    f"{statistics.median(during) / statistics.median(baseline):5.1f}x"
                    if during
                    else f"flood N={n:<5} reads {_summary(during)}"
                )
                other = {k: v for k, v in read_statuses.items() if k != "200"}
                print(
                    f"{'':<12} flood answers {codes}; flood took {took:5.1f} s (median answer "
                    f"{answer * 1000:7.1f} ms); pool peak {peak}/{pool}"
                    + (f"; reads not 200: {other}" if other else "")
                )
    finally:
        server.should_exit = True
        await serving
        await runtime.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--floods", default="60,250", help="comma-separated flood sizes")
    parser.add_argument("--reads", type=int, default=40, help="reads per phase (at least)")
    parser.add_argument("--seconds", type=float, default=60.0, help="bound of one flood")
    args = parser.parse_args()
    floods = [int(n) for n in args.floods.split(",") if n]
    with bench_database() as url:
        asyncio.run(run(url, floods, args.reads, args.seconds))


if __name__ == "__main__":
    main()
