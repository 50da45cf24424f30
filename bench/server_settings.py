"""Which PostgreSQL settings the embedded cluster should run with, measured on memgate's own
read statements: stock (`jit` on, 2 parallel workers per gather, as PostgreSQL ships) against
`jit` off, parallel query off, and both off.

    .venv/bin/python -m bench.server_settings [--rows 100000] [--queries 30] [--rounds 3]

One tenant of `--rows` rows over 1,000 spaces (bench/search.py's loader: COPY, then the
migration's HNSW index built in bulk). The statements are the product's own
(service/memory/repository.py): the exact search at 1k and 10k visible rows, the HNSW walk at
half the table visible, and the counts grouped by subject over every row. Each runs on one
open transaction (no pool checkout or commit in the timing), the variants interleaved query by
query so load drifts hit each alike; prints p50 / p95 in ms and each variant's p50 over
stock's. The machine is shared: read the ratios, not the absolute times.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from bench.database import bench_database
from bench.search import N_SPACES, _vectors, load
from service.db.session import create_engine, create_sessionmaker
from service.memory.repository import (
    AnnTuning,
    MemoryFilters,
    count,
    search_approximate,
    search_exact_within,
)
from service.policy.visible import Action, Visible
from service.settings import MemorySettings

K = 10
NO_FILTERS = MemoryFilters()
VARIANTS = {
    "stock (jit on, 2 workers)": {"jit": "on", "max_parallel_workers_per_gather": "2"},
    "jit off": {"jit": "off", "max_parallel_workers_per_gather": "2"},
    "parallel off": {"jit": "on", "max_parallel_workers_per_gather": "0"},
    "both off": {"jit": "off", "max_parallel_workers_per_gather": "0"},
}
Statement = Callable[[AsyncSession, list[float]], Awaitable[int]]


def _statements(tenant: uuid.UUID, spaces: list[uuid.UUID]) -> dict[str, Statement]:
    limits = MemorySettings()
    per_space = {n: Visible.of_spaces(tenant, Action.READ, spaces[:n]) for n in (10, 100, 500)}

    def exact(scope: Visible) -> Statement:
        async def run(session: AsyncSession, q: list[float]) -> int:
            hits = await search_exact_within(
                session, scope, q, NO_FILTERS, k=K, min_score=None,
                size_limit=limits.exact_search_max_rows,
                count_limit=limits.search_fallback_max_rows,
            )  # fmt: skip
            return len(hits) if isinstance(hits, list) else 0

        return run

    async def walk(session: AsyncSession, q: list[float]) -> int:
        tuning = AnnTuning(limits.ann_ef_search, limits.ann_max_scan_tuples)
        scope = per_space[500]
        return len(await search_approximate(session, scope, q, NO_FILTERS, k=K, tuning=tuning))

    async def counts(session: AsyncSession, _: list[float]) -> int:
        scope = per_space[500]
        total, _groups = await count(session, scope, NO_FILTERS, group_by="subject", max_groups=50)
        return total

    return {
        "exact search, 1% visible": exact(per_space[10]),
        "exact search, 10% visible": exact(per_space[100]),
        "HNSW walk, 50% visible": walk,
        "counts by subject, 50% visible": counts,
    }


async def _apply(session: AsyncSession, settings: dict[str, str]) -> None:
    for name, value in settings.items():
        await session.execute(text(f"SET {name} = '{value}'"))  # fixed names and values


def _row(label: str, times: list[float], stock_p50: float) -> str:
    ordered = sorted(times)
    p50, p95 = statistics.median(ordered), ordered[int(0.95 * (len(ordered) - 1))]
    return f"  {label:<28} p50 {p50:8.2f}  p95 {p95:8.2f}  vs stock {p50 / stock_p50:5.2f}"


async def run(url: str, rows: int, queries: int, rounds: int) -> None:
    vectors = await _vectors("random", rows + queries, seed=13)
    tenant, spaces = load(url, vectors[:rows])
    query_vectors = [v.tolist() for v in vectors[rows:]]
    engine = create_engine(url)
    print(f"{rows} rows, {N_SPACES} spaces, {queries} queries x {rounds} rounds per variant (ms)")
    async with create_sessionmaker(engine)() as session, session.begin():
        for name, statement in _statements(tenant, spaces).items():
            times: dict[str, list[float]] = {label: [] for label in VARIANTS}
            for settings in VARIANTS.values():  # warm-up: caches and plans, one query each
                await _apply(session, settings)
                await statement(session, query_vectors[0])
            for _ in range(rounds):
                for q in query_vectors:
                    for label, settings in VARIANTS.items():
                        await _apply(session, settings)
                        started = time.perf_counter()
                        await statement(session, q)
                        times[label].append((time.perf_counter() - started) * 1000)
            print(name)
            stock = statistics.median(times[next(iter(VARIANTS))])
            for label, measured in times.items():
                print(_row(label, measured, stock))
    await engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with bench_database() as url:
        asyncio.run(run(url, args.rows, args.queries, args.rounds))


if __name__ == "__main__":
    main()
