"""What a `min_score` near 1 costs above the exact limit (review item 16): such a floor cuts
into every walk's k, so before the fix each call ranked the caller's whole visible set exactly
(linear in it, uncapped). Measures `MemoryService.rank` for one tenant at two visible-set sizes
(half and all of `--rows`), p50 and p95 over `--queries` queries, under the code on PYTHONPATH
and these settings: the defaults, and a fallback cap equal to the exact limit.

    .venv/bin/python -m bench.read_bounds [--rows 60000] [--queries 40] [--min-score 0.99]

To compare with older code, run the same file against that code's `service` package, e.g.
`git archive <commit> service | tar -x -C /tmp/old && PYTHONPATH=/tmp/old python -m ...`
(settings the older code does not know are left out). Each line also says what the calls
answered (path and hits, or the problem's slug). Medians, not single runs: the machine is
shared.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections import Counter
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import fields, replace
from typing import Any

import numpy as np
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from bench.database import bench_database
from bench.search import N_SPACES, _vectors, load
from service.calls import Facts
from service.db.session import create_engine, create_sessionmaker
from service.embeddings.wordllama import WordLlamaEmbedder
from service.memory import repository
from service.memory.repository import MemoryFilters
from service.memory.service import MemoryService
from service.policy.visible import Action, Visible
from service.problems import Problem
from service.settings import MemorySettings

K = 10


def _settings(**changes: Any) -> MemorySettings:
    known = {f.name for f in fields(MemorySettings)}
    return replace(MemorySettings(), **{k: v for k, v in changes.items() if k in known})


def _budget(session: AsyncSession, limits: MemorySettings) -> AbstractAsyncContextManager[Any]:
    """The read budget the service puts around a search, where the code has one."""
    budget = getattr(repository, "read_budget", None)
    timeout = getattr(limits, "read_statement_timeout_ms", None)
    if budget is None or timeout is None:
        return nullcontext()
    manager: AbstractAsyncContextManager[Any] = budget(session, timeout)
    return manager


async def _measure(
    sessionmaker: async_sessionmaker[AsyncSession],
    embedder: WordLlamaEmbedder,
    limits: MemorySettings,
    scope: Visible,
    queries: np.ndarray,
    min_score: float,
) -> tuple[list[float], Counter[str]]:
    latencies: list[float] = []
    outcomes: Counter[str] = Counter()
    cancelled = getattr(repository, "ReadCancelled", ())
    for vector in queries:
        t0 = time.perf_counter()
        try:
            async with sessionmaker() as session, session.begin():
                service = MemoryService(session, embedder, limits, facts=Facts())
                async with _budget(session, limits):
                    hits, path = await service.rank(
                        scope, vector.tolist(), MemoryFilters(), K, min_score
                    )
                outcomes[f"{path} ({len(hits)} hits)"] += 1
        except Problem as problem:
            outcomes[problem.slug] += 1
        except cancelled:
            outcomes["statement timeout"] += 1
        latencies.append((time.perf_counter() - t0) * 1000)
    return latencies, outcomes


async def run(url: str, rows: int, queries: int, min_score: float) -> None:
    vectors = await _vectors("text", rows + queries, seed=7)
    tenant, spaces = load(url, vectors[:rows])
    engine = create_engine(url)
    sessionmaker = create_sessionmaker(engine)
    embedder = WordLlamaEmbedder()
    defaults = MemorySettings()
    variants = {
        "defaults": _settings(),
        "cap = exact limit": _settings(search_fallback_max_rows=defaults.exact_search_max_rows),
    }
    for share in (0.5, 1.0):
        allowed = spaces[: int(N_SPACES * share)]
        scope = Visible.of_spaces(tenant, Action.READ, allowed)
        print(f"{int(rows * share)} visible rows, min_score {min_score}, k {K}")
        for label, limits in variants.items():
            latencies, outcomes = await _measure(
                sessionmaker, embedder, limits, scope, vectors[rows:], min_score
            )
            p50 = statistics.median(latencies)
            p95 = statistics.quantiles(latencies, n=20)[18]
            said = ", ".join(f"{what} x{n}" for what, n in sorted(outcomes.items()))
            print(f"  {label:<20} p50 {p50:8.2f} ms  p95 {p95:8.2f} ms  {said}")
    await engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=60_000)
    parser.add_argument("--queries", type=int, default=40)
    parser.add_argument("--min-score", type=float, default=0.99)
    args = parser.parse_args()
    with bench_database() as url:
        asyncio.run(run(url, args.rows, args.queries, args.min_score))


if __name__ == "__main__":
    main()
