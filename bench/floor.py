"""The floor of the fixed stack on this box: what Litestar on uvicorn serves when a request does
(almost) nothing, beside `memgate serve` doing a real search, driven by the same load client.

    .venv/bin/python -m bench.floor [--workers 2] [--concurrency 1,16] [--duration 6]
        [--memories 300] [--skip-memgate]

Layers, each served by `uvicorn --workers N --loop uvloop --http httptools` (memgate's own
server settings) on a free loopback port, each answering the load client's search request
(`POST /v1/memories/search`, its bearer token and JSON body):

- `echo`: Litestar decodes the JSON body into a struct and answers `{"hits": []}`;
- `one-query`: the same, plus one round trip on a pooled psycopg connection (`SELECT 1`);
- `memgate`: `memgate serve` searching `--memories` memories (audit on), as bench.http_load.

Prints requests/s, p50/p95 ms and the server tree's CPU ms per request (PostgreSQL's included
where there is one). Reading it: the target of N requests/s on 2 cores is a budget of
2000 / N ms of CPU per request for server, database and client together."""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.http_load import (
    HERE,
    Level,
    _free_port,
    _ints,
    agent_token,
    run_level,
    served,
    tree_cpu,
)

LAYERS = ("echo", "one-query")


@dataclass(frozen=True)
class SearchBody:
    query: str
    k: int = 10


def app() -> Any:
    """The floor app (uvicorn's factory): FLOOR_LAYER says what a request does."""
    from litestar import Litestar, post

    layer = os.environ["FLOOR_LAYER"]
    pool: Any = None

    async def open_pool() -> None:
        nonlocal pool
        if layer == "one-query":
            from psycopg_pool import AsyncConnectionPool

            pool = AsyncConnectionPool(os.environ["FLOOR_DATABASE_URL"], min_size=4, open=False)
            await pool.open()

    async def close_pool() -> None:
        if pool is not None:
            await pool.close()

    @post("/v1/memories/search", status_code=200)
    async def search(data: SearchBody) -> dict[str, list[Any]]:
        if pool is not None:
            async with pool.connection() as conn:
                await (await conn.execute("SELECT 1")).fetchone()
        return {"hits": []}

    @post("/readyz", status_code=200)
    async def ready() -> dict[str, str]:
        return {"status": "ok"}

    return Litestar([search, ready], on_startup=[open_pool], on_shutdown=[close_pool])


@dataclass
class Floor:
    process: subprocess.Popen[bytes]
    port: int
    roots: list[int]


@contextmanager
def floor_server(layer: str, workers: int, database_url: str | None) -> Iterator[Floor]:
    port = _free_port()
    env = dict(os.environ, FLOOR_LAYER=layer, PYTHONPATH=str(HERE))
    if database_url:
        env["FLOOR_DATABASE_URL"] = database_url
    process = subprocess.Popen(  # noqa: S603 (uvicorn on loopback, our own module)
        [
            sys.executable, "-m", "uvicorn", "bench.floor:app", "--factory",
            "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers),
            "--loop", "uvloop", "--http", "httptools", "--no-access-log",
            "--log-level", "warning",
        ],
        cwd=HERE,
        env=env,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.post(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        else:
            raise SystemExit(f"the {layer} floor did not start")
        time.sleep(1.0 * workers)  # every worker up
        yield Floor(process, port, [process.pid])
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)


def _row(name: str, port: int, token: str, roots: list[int], args: argparse.Namespace) -> None:
    for concurrency in args.concurrency:
        run_level(Level(port, token, "search", concurrency, 50, 30.0, 9))
        before = tree_cpu(roots)
        outcome = run_level(
            Level(port, token, "search", concurrency, args.requests, args.duration, 1)
        )
        cpu = tree_cpu(roots) - before
        served_ok = outcome.statuses.get(200, 0)
        latencies = sorted(outcome.latencies)
        p50 = statistics.median(latencies) * 1000
        p95 = latencies[int(0.95 * (len(latencies) - 1))] * 1000
        print(
            f"{name:<12} c={concurrency:<3} {served_ok / outcome.elapsed:8.1f}/s "
            f"p50 {p50:6.2f} p95 {p95:6.2f} ms  CPU {1000 * cpu / max(1, len(latencies)):6.2f} "
            f"ms/request  statuses {dict(outcome.statuses)}",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=_ints, default=[1, 16])
    parser.add_argument("--duration", type=float, default=6.0)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--memories", type=int, default=300)
    parser.add_argument("--skip-memgate", action="store_true")
    args = parser.parse_args()
    # memgate first: its embedded PostgreSQL also serves the one-query floor.
    with served(HERE, args.workers) as server:
        token = agent_token(server)
        run_level(Level(server.port, token, "write", 16, args.memories, 180.0, 0))
        if not args.skip_memgate:
            _row("memgate", server.port, token, server.roots(), args)
        url = _database_url(server.data_dir)
        postmaster = server.roots()[1]
        for layer in LAYERS:
            with floor_server(layer, args.workers, url) as floor:
                roots = floor.roots + ([postmaster] if layer == "one-query" else [])
                _row(layer, floor.port, token, roots, args)


def _database_url(data_dir: Path) -> str:
    lines = (data_dir / "pgdata" / "postmaster.pid").read_text().splitlines()
    return f"postgresql://postgres@/postgres?host={lines[4]}&port={lines[3]}"


if __name__ == "__main__":
    main()
