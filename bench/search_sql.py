"""The exact search statement against the plain query it should cost no more than: the
visible rows ordered by distance with LIMIT k (a top-N heapsort over the tenant's covering
btree), at 100, 1k and 10k visible rows of a 100k-row table, before (the statement at
e408d5b: a materialized CTE over every visible row, a size subquery counting the visible rows,
ORM entities) and after (`repository.search_exact_within`: a fenced top-N, an upper-bound size
gate on the narrow index, Core rows of the answer's columns).

    .venv/bin/python -m bench.search_sql [--rows 100000] [--queries 40] [--rounds 3]

Each statement runs on one open transaction (no pool checkout or commit in the timing),
rounds interleaved so load drifts hit every variant alike; prints p50 / p95 in ms and each
one's p50 over the naive query's, then EXPLAIN (ANALYZE, BUFFERS) of the after statement at 1k
visible rows. Starts its own embedded PostgreSQL (or uses DATABASE_URL), loads with COPY and
builds the migration's HNSW index, so the planner could take the ANN index if a statement let
it. The machine is shared: read the ratios, not the absolute times.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import ScalarSelect, Select, func, literal, select, text
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncSession

from bench.database import bench_database
from bench.search import N_SPACES, _vectors, load
from service.db.models import Memory
from service.db.session import create_engine, create_sessionmaker
from service.memory.repository import (
    ANSWER,
    MemoryFilters,
    _exact,
    search_exact_within,
)
from service.policy.visible import Action, Visible
from service.settings import MemorySettings

K = 10
VISIBLE_SPACES = (1, 10, 100)
"""Spaces of 100 rows each (at the default 100k rows): 100, 1k and 10k visible rows."""
NO_FILTERS = MemoryFilters()

Run = Callable[[AsyncSession, list[float]], Awaitable[int]]

NAIVE = text(
    "SELECT id, embedding <=> CAST(:q AS vector) AS distance FROM memories "
    "WHERE tenant_id = :t AND space_id = ANY(:s) AND superseded_at IS NULL "
    "AND revoked_at IS NULL AND read_requires <@ CAST(:s AS uuid[]) "
    "AND (expires_at IS NULL OR expires_at > now()) "
    "ORDER BY (embedding <=> CAST(:q AS vector)) + 0 LIMIT :k"
)
"""The plain query over the same visible rows (the predicate Visible writes, as the owner, no
grants subquery): the visible rows ordered by distance, LIMIT k. The `+ 0` keeps the planner
off the HNSW index, which at 10 % visible would answer short: this is the btree + top-N plan."""


# --- before: the builder at e408d5b, kept verbatim for the comparison ----------------------


def _before_count(scope: Visible, limit: int) -> ScalarSelect[int]:
    capped = scope.select(literal(1)).limit(limit).subquery()
    return select(func.count()).select_from(capped).scalar_subquery()


def _before_exact(scope: Visible, query_vector: list[float], size_limit: int) -> Select[Any]:
    distance = Memory.embedding.cosine_distance(query_vector)
    scored = scope.select(Memory.id.label("id"), distance.label("distance"))
    scored = scored.where(_before_count(scope, size_limit + 1) <= size_limit)
    scored_cte = scored.cte("scored").prefix_with("MATERIALIZED")
    ranked_cte = (
        select(scored_cte.c.id, scored_cte.c.distance)
        .order_by(scored_cte.c.distance, scored_cte.c.id)
        .limit(K)
        .cte("ranked")
        .prefix_with("MATERIALIZED")
    )
    return (
        scope.select(Memory, (1.0 - ranked_cte.c.distance).label("score"))
        .join(ranked_cte, ranked_cte.c.id == Memory.id)
        .order_by(ranked_cte.c.distance, Memory.id)
    )


# --- after, with ORM entities instead of Core rows (does the ORM matter?) -----------------


def _after_as_entities(scope: Visible, query_vector: list[float], size_limit: int) -> Select[Any]:
    core = _exact(scope, query_vector, NO_FILTERS, k=K, min_score=None, size_limit=size_limit)
    return core.with_only_columns(Memory, *core.selected_columns[len(ANSWER) :])


def _variants(tenant: uuid.UUID, spaces: list[uuid.UUID]) -> dict[str, Run]:
    scope = Visible.of_spaces(tenant, Action.READ, spaces)
    limit = MemorySettings().exact_search_max_rows

    async def naive(session: AsyncSession, q: list[float]) -> int:
        params = {"t": tenant, "s": spaces, "q": str(q), "k": K}
        return len((await session.execute(NAIVE, params)).all())

    async def before(session: AsyncSession, q: list[float]) -> int:
        return len((await session.execute(_before_exact(scope, q, limit))).all())

    async def after(session: AsyncSession, q: list[float]) -> int:
        hits = await search_exact_within(
            session, scope, q, NO_FILTERS, k=K, min_score=None, size_limit=limit,
            count_limit=MemorySettings().search_fallback_max_rows,
        )  # fmt: skip
        assert isinstance(hits, list)
        return len(hits)

    async def after_orm(session: AsyncSession, q: list[float]) -> int:
        return len((await session.execute(_after_as_entities(scope, q, limit))).all())

    return {
        "naive btree + top-N": naive,
        "before (e408d5b)": before,
        "after (product)": after,
        "after, as ORM entities": after_orm,
    }


async def _server_ms(session: AsyncSession, statement: Any, params: dict[str, Any]) -> float:
    """Planning + execution time the server reports (EXPLAIN ANALYZE, no timing per node)."""
    explain = text(f"EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) {statement}")
    [plan] = (await session.execute(explain, params)).scalar_one()
    return float(plan["Planning Time"]) + float(plan["Execution Time"])


def _literal_sql(statement: Select[Any]) -> str:
    dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
    return str(statement.compile(dialect=dialect, compile_kwargs={"literal_binds": True}))


async def _server_times(
    session: AsyncSession, tenant: uuid.UUID, spaces: list[uuid.UUID], queries: list[list[float]]
) -> tuple[float, float, float]:
    """Server-side p50 (ms) of the naive query, the before and the after statement."""
    scope = Visible.of_spaces(tenant, Action.READ, spaces)
    naive, before, after = [], [], []
    for q in queries:
        params = {"t": tenant, "s": spaces, "q": str(q), "k": K}
        naive.append(await _server_ms(session, NAIVE.text, params))
        before.append(await _server_ms(session, _literal_sql(_before_exact(scope, q, 20_000)), {}))
        statement = _exact(scope, q, NO_FILTERS, k=K, min_score=None, size_limit=20_000)
        after.append(await _server_ms(session, _literal_sql(statement), {}))
    return statistics.median(naive), statistics.median(before), statistics.median(after)


async def _explain(session: AsyncSession, tenant: uuid.UUID, spaces: list[uuid.UUID],
                   q: list[float]) -> None:  # fmt: skip
    scope = Visible.of_spaces(tenant, Action.READ, spaces)
    statement = _exact(scope, q, NO_FILTERS, k=K, min_score=None, size_limit=20_000)
    plan = await session.execute(text(f"EXPLAIN (ANALYZE, BUFFERS) {_literal_sql(statement)}"))
    for (line,) in plan:
        print("   ", line if len(line) < 150 else line[:147] + "...")


async def run(url: str, rows: int, queries: int, rounds: int) -> None:
    vectors = await _vectors("random", rows + queries, seed=11)
    tenant, spaces = load(url, vectors[:rows])
    query_vectors = [v.tolist() for v in vectors[rows:]]
    engine = create_engine(url)
    sessionmaker = create_sessionmaker(engine)
    per_space = rows // N_SPACES
    async with sessionmaker() as session, session.begin():
        for n in VISIBLE_SPACES:
            variants = _variants(tenant, spaces[:n])
            times: dict[str, list[float]] = {label: [] for label in variants}
            for _ in range(rounds + 1):  # the first round warms up and is dropped
                for label, variant in variants.items():
                    for q in query_vectors:
                        t0 = time.perf_counter()
                        assert await variant(session, q) == K
                        times[label].append((time.perf_counter() - t0) * 1000)
            print(f"{n * per_space} visible rows of {rows} (k={K}, {queries * rounds} runs each)")
            print("  client side (ms: statement built, sent, rows read):")
            naive_p50 = statistics.median(times["naive btree + top-N"][queries:])
            for label, measured in times.items():
                kept = measured[queries:]
                p50, p95 = statistics.median(kept), statistics.quantiles(kept, n=20)[18]
                ratio = p50 / naive_p50
                print(f"    {label:<24} p50 {p50:7.2f}  p95 {p95:7.2f}  p50/naive {ratio:5.2f}")
            naive_ms, before_ms, after_ms = await _server_times(
                session, tenant, spaces[:n], query_vectors
            )
            print(
                f"  server side p50 (planning + execution, ms): naive {naive_ms:.2f}, "
                f"before {before_ms:.2f} ({before_ms / naive_ms:.2f}x), "
                f"after {after_ms:.2f} ({after_ms / naive_ms:.2f}x)"
            )
        print(f"EXPLAIN (ANALYZE, BUFFERS), after, {10 * per_space} visible rows:")
        await _explain(session, tenant, spaces[:10], query_vectors[0])
    await engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with bench_database() as url:
        asyncio.run(run(url, args.rows, args.queries, args.rounds))


if __name__ == "__main__":
    main()
