"""Soak: a mixed load at a fixed rate against a real `memgate serve`, for a long time.

    .venv/bin/python -m bench.soak [--minutes 30] [--rate 40] [--workers 2] [--memories 300]
        [--sample-seconds 10] [--out soak.json]

It starts `memgate serve` (bench/http_load.py `served`: a fresh embedded PostgreSQL, audit on),
follows the README's first steps to an agent token, writes `--memories` memories, then sends
`--rate` requests per second for `--minutes` from a separate process (which gets a fresh
token every two minutes, as a client would: tokens live minutes): searches (k=10, varied
queries), writes (distinct keys), gets of a written memory and list pages, in the proportions
of `MIX`. The rate is fixed (open loop): each request has a due time, and its latency is
counted from that time, so a server that falls behind shows it in the percentiles instead of
slowing the load down.

Reported, per route: requests, errors (any answer but 2xx, or no answer), p50/p95/p99 in ms.
Memory: the private resident memory (RssAnon: the heap, not shared or file pages; PostgreSQL's
shared buffers would otherwise show as growth while they fill) of the server's processes
(serve and its workers) and of its PostgreSQL, sampled every `--sample-seconds`, with the
least-squares slope in MB per minute after the first fifth of the run (warm-up: caches, pools
and prepared statements fill). The exit code is 1 when any request failed.

The suite runs it for 20 seconds (tests/integration/cli/test_soak.py); the closing notes
report the 30-minute run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from memgate_client import ClientCredentials

from bench.corpus import sentences
from bench.http_load import (
    HERE,
    REQUEST_SECONDS,
    START_SECONDS,
    Level,
    Served,
    _answer,
    _percentile,
    agent_credentials,
    issue_token,
    run_level,
    served,
    tree_pids,
)

MIX = (("search", 5), ("write", 2), ("get", 2), ("list", 1))
"""Route and weight: out of every 10 requests, 5 searches, 2 writes, 2 gets and 1 list."""
CONNECTIONS = 16
"""Keep-alive connections of the load process; enough that the rate never waits for one."""


TOKEN_REFRESH_SECONDS = 120.0
"""How often the load process gets a fresh token (they live minutes; a soak runs longer)."""


@dataclass(frozen=True)
class Plan:
    port: int
    credentials: ClientCredentials
    rate: float
    seconds: float
    memory_ids: tuple[str, ...]
    refresh_seconds: float = TOKEN_REFRESH_SECONDS

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass
class Outcome:
    latencies: dict[str, list[float]] = field(default_factory=dict)
    errors: Counter[str] = field(default_factory=Counter)
    statuses: Counter[str] = field(default_factory=Counter)


def _routes() -> list[str]:
    return [route for route, weight in MIX for _ in range(weight)]


def _request(plan: Plan, token: str, route: str, i: int, texts: list[str]) -> bytes:
    method, path, body = "GET", "", b""
    if route == "search":
        method, path = "POST", "/v1/memories/search"
        body = json.dumps({"query": texts[i % len(texts)], "k": 10}).encode()
    elif route == "write":
        method, path = "POST", "/v1/memories"
        body = json.dumps(
            {
                "subject": f"service:soak.{i}",
                "kind": "fact",
                "key": f"soak.{i}",
                "value": texts[i % len(texts)],
            }
        ).encode()
    elif route == "get":
        path = f"/v1/memories/{plan.memory_ids[i % len(plan.memory_ids)]}"
    else:
        path = "/v1/memories?limit=20"
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{plan.port}\r\n"
        f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _drive(plan: Plan) -> Outcome:
    texts = sentences(500, seed=7)
    routes = _routes()
    outcome = Outcome(latencies={route: [] for route, _ in MIX})
    loop = asyncio.get_running_loop()
    total = int(plan.rate * plan.seconds)
    start = loop.time() + 0.1
    issued = 0
    token = await asyncio.to_thread(issue_token, plan.url, plan.credentials)

    async def refresh() -> None:
        nonlocal token
        while True:
            await asyncio.sleep(plan.refresh_seconds)
            token = await asyncio.to_thread(issue_token, plan.url, plan.credentials)

    async def connection() -> None:
        nonlocal issued
        streams = await asyncio.open_connection("127.0.0.1", plan.port)
        while issued < total:
            i, issued = issued, issued + 1
            due = start + i / plan.rate
            await asyncio.sleep(max(0.0, due - loop.time()))
            route = routes[i % len(routes)]
            try:
                streams[1].write(_request(plan, token, route, i, texts))
                status = await asyncio.wait_for(_answer(streams[0]), REQUEST_SECONDS)
            except (OSError, asyncio.IncompleteReadError, TimeoutError) as failed:
                outcome.errors[route] += 1
                outcome.statuses[f"{route} {type(failed).__name__}"] += 1
                streams[1].close()
                streams = await asyncio.open_connection("127.0.0.1", plan.port)
                continue
            outcome.latencies[route].append(loop.time() - due)
            outcome.statuses[f"{route} {status}"] += 1
            if not 200 <= status < 300:
                outcome.errors[route] += 1
        streams[1].close()

    refreshing = asyncio.create_task(refresh())
    try:
        await asyncio.gather(*(connection() for _ in range(CONNECTIONS)))
    finally:
        refreshing.cancel()
    return outcome


def _drive_in_process(plan: Plan, results: Any) -> None:
    import uvloop

    results.put(uvloop.run(_drive(plan)))


# --- memory of the server's processes --------------------------------------------------------


def _rss_mb(pids: list[int]) -> float:
    total_kb = 0
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        for line in status.splitlines():
            if line.startswith("RssAnon:"):
                total_kb += int(line.split()[1])
    return total_kb / 1024


@dataclass
class Samples:
    """(minutes since the load began, app MB, PostgreSQL MB), one per sampling tick."""

    rows: list[tuple[float, float, float]] = field(default_factory=list)

    def take(self, server: Served, began: float) -> None:
        serve, postmaster = server.roots()
        database = tree_pids([postmaster])
        app = [pid for pid in tree_pids([serve]) if pid not in database]
        minutes = (time.monotonic() - began) / 60
        self.rows.append((minutes, _rss_mb(app), _rss_mb(list(database))))

    def slope(self, column: int) -> float:
        """MB per minute after the warm-up (the first fifth of the samples)."""
        kept = self.rows[len(self.rows) // 5 :]
        if len(kept) < 2:
            return 0.0
        xs, ys = [row[0] for row in kept], [row[column] for row in kept]
        return statistics.linear_regression(xs, ys).slope


# --- the run ---------------------------------------------------------------------------------


@dataclass
class RouteReport:
    route: str
    requests: int
    errors: int
    p50: float
    p95: float
    p99: float


@dataclass
class Report:
    minutes: float
    rate: float
    routes: list[RouteReport]
    statuses: dict[str, int]
    app_mb: tuple[float, float]
    database_mb: tuple[float, float]
    app_slope: float
    database_slope: float
    samples: list[tuple[float, float, float]]

    @property
    def errors(self) -> int:
        return sum(route.errors for route in self.routes)


def soak(
    minutes: float,
    rate: float,
    *,
    workers: int = 2,
    memories: int = 300,
    sample_seconds: float = 10.0,
    refresh_seconds: float = TOKEN_REFRESH_SECONDS,
    checkout: Path = HERE,
) -> Report:
    with served(checkout, workers) as server:
        credentials = agent_credentials(server)
        token = issue_token(server.url, credentials)
        seeding = Level(server.port, token, "write", 8, memories, START_SECONDS, seed=0)
        run_level(seeding)
        listed = httpx.get(
            f"{server.url}/v1/memories",
            params={"limit": 100},
            headers={"Authorization": f"Bearer {token}"},
            timeout=REQUEST_SECONDS,
        )
        listed.raise_for_status()
        ids = tuple(item["id"] for item in listed.json()["items"])
        plan = Plan(server.port, credentials, rate, minutes * 60, ids, refresh_seconds)
        outcome, samples = _run_sampled(server, plan, sample_seconds)
    return _report(plan, outcome, samples)


def _run_sampled(server: Served, plan: Plan, sample_seconds: float) -> tuple[Outcome, Samples]:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    driver = context.Process(target=_drive_in_process, args=(plan, results))
    samples, stop = Samples(), threading.Event()
    began = time.monotonic()

    def sample() -> None:
        while not stop.wait(0 if not samples.rows else sample_seconds):
            samples.take(server, began)

    sampler = threading.Thread(target=sample, daemon=True)
    driver.start()
    sampler.start()
    try:
        outcome: Outcome = results.get(timeout=plan.seconds + START_SECONDS)
    finally:
        stop.set()
        sampler.join()
        driver.join(REQUEST_SECONDS)
        if driver.is_alive():
            driver.kill()
    samples.take(server, began)
    return outcome, samples


def _report(plan: Plan, outcome: Outcome, samples: Samples) -> Report:
    routes = []
    for route, _ in MIX:
        ms = sorted(s * 1000 for s in outcome.latencies[route])
        routes.append(
            RouteReport(
                route,
                sum(n for key, n in outcome.statuses.items() if key.split()[0] == route),
                outcome.errors[route],
                statistics.median(ms) if ms else 0.0,
                _percentile(ms, 0.95) if ms else 0.0,
                _percentile(ms, 0.99) if ms else 0.0,
            )
        )
    first, last = samples.rows[0], samples.rows[-1]
    return Report(
        minutes=plan.seconds / 60,
        rate=plan.rate,
        routes=routes,
        statuses=dict(outcome.statuses),
        app_mb=(first[1], last[1]),
        database_mb=(first[2], last[2]),
        app_slope=samples.slope(1),
        database_slope=samples.slope(2),
        samples=samples.rows,
    )


def print_report(report: Report) -> None:
    print(f"soak: {report.minutes:g} min at {report.rate:g} requests/s")
    print(f"{'route':<8} {'requests':>8} {'errors':>6} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8}")
    for route in report.routes:
        print(
            f"{route.route:<8} {route.requests:>8} {route.errors:>6} {route.p50:>8.1f} "
            f"{route.p95:>8.1f} {route.p99:>8.1f}"
        )
    print(
        f"private RSS: app {report.app_mb[0]:.0f} -> {report.app_mb[1]:.0f} MB "
        f"(slope {report.app_slope:+.2f} MB/min after warm-up); PostgreSQL "
        f"{report.database_mb[0]:.0f} -> {report.database_mb[1]:.0f} MB "
        f"(slope {report.database_slope:+.2f} MB/min)"
    )
    print(f"answers: {report.statuses}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=40.0, help="requests per second")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--memories", type=int, default=300, help="written before the soak")
    parser.add_argument("--sample-seconds", type=float, default=10.0)
    parser.add_argument("--out", type=Path, help="also write the report as JSON here")
    args = parser.parse_args()
    report = soak(
        args.minutes,
        args.rate,
        workers=args.workers,
        memories=args.memories,
        sample_seconds=args.sample_seconds,
    )
    print_report(report)
    if args.out:
        args.out.write_text(json.dumps(asdict(report), indent=2))
    raise SystemExit(1 if report.errors else 0)


if __name__ == "__main__":
    main()
