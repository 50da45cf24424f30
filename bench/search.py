"""Filtered search: memgate's exact pre-filtered path vs a global HNSW index with a permission
filter (the naive design) vs the same index with pgvector's iterative scan, at several visible
fractions of one tenant, vs a partial HNSW index built for exactly the visible set.

    .venv/bin/python -m bench.search [--rows 100000] [--queries 40] [--k 10]

Starts its own embedded PostgreSQL (or uses DATABASE_URL), loads random unit vectors with COPY,
and prints p50/p95 latency, how many queries came back short of k, recall@k against the exact
answer, and the latency ratio naive/exact. Medians, not single runs: the machine is shared.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from dataclasses import dataclass

import numpy as np
import psycopg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from bench.database import bench_database
from service.db.session import create_engine, create_sessionmaker
from service.memory.repository import MemoryFilters, search
from service.policy.visible import Action, Visible

DIMS = 256
# The naive design: one global ANN index, the permission filter in the same WHERE, ids only.
NAIVE = text(
    "SELECT id FROM memories WHERE tenant_id = :t AND space_id = ANY(:s) "
    "AND superseded_at IS NULL AND revoked_at IS NULL "
    "ORDER BY embedding <=> CAST(:q AS vector) LIMIT :k"
)
# The same index with pgvector 0.8's iterative scan: it keeps scanning until k rows pass the
# filter (or max_scan_tuples is spent), then the CTE restores exact order.
ITERATIVE_SETTINGS = (
    "SET LOCAL hnsw.iterative_scan = relaxed_order",
    "SET LOCAL hnsw.max_scan_tuples = 20000",
    "SET LOCAL hnsw.ef_search = 100",
)
ITERATIVE = text(
    "WITH candidates AS MATERIALIZED ("
    " SELECT id, embedding <=> CAST(:q AS vector) AS distance FROM memories"
    " WHERE tenant_id = :t AND space_id = ANY(:s)"
    " AND superseded_at IS NULL AND revoked_at IS NULL"
    " ORDER BY embedding <=> CAST(:q AS vector) LIMIT :k)"
    " SELECT id FROM candidates ORDER BY distance"
)
FRACTIONS = (0.001, 0.01, 0.1)


@dataclass
class Result:
    label: str
    latencies_ms: list[float]
    short: int
    recall: float

    def row(self) -> str:
        p50 = statistics.median(self.latencies_ms)
        p95 = statistics.quantiles(self.latencies_ms, n=20)[18]
        return (
            f"{self.label:<36} p50 {p50:8.2f} ms  p95 {p95:8.2f} ms  "
            f"short {self.short:3d}  recall {self.recall:.3f}"
        )


def _vector_text(vector: np.ndarray) -> str:
    return "[" + ",".join(f"{v:.6f}" for v in vector) + "]"


def load(url: str, rows: int, rng: np.random.Generator) -> tuple[uuid.UUID, list[uuid.UUID]]:
    """One tenant; spaces sized so that unions of them hit each visible fraction."""
    tenant = uuid.uuid4()
    n_spaces = 1000
    spaces = [uuid.uuid4() for _ in range(n_spaces)]
    owner = uuid.uuid4()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO tenants (tenant_id, name) VALUES (%s, 'bench')", (tenant,))
        with conn.cursor().copy("COPY spaces (tenant_id, id, kind, name) FROM STDIN") as copy:
            for space in spaces:
                copy.write_row((tenant, space, "team", str(space)))
        vectors = rng.standard_normal((rows, DIMS)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        columns = (
            "tenant_id, id, space_id, owner_id, writer_id, client_id, subject, kind, key, "
            "value, content_hash, embedding, embedding_model"
        )
        with conn.cursor().copy(f"COPY memories ({columns}) FROM STDIN") as copy:
            for i in range(rows):
                copy.write_row(
                    (
                        tenant,
                        uuid.uuid4(),
                        spaces[i % n_spaces],
                        owner,
                        owner,
                        "bench",
                        "s",
                        "fact",
                        f"k{i}",
                        "v",
                        b"h",
                        _vector_text(vectors[i]),
                        "random",
                    )
                )
        conn.execute("VACUUM ANALYZE memories")
    return tenant, spaces


async def run(url: str, rows: int, queries: int, k: int) -> None:
    rng = np.random.default_rng(7)
    started = time.perf_counter()
    tenant, spaces = load(url, rows, rng)
    print(f"loaded {rows} rows in {time.perf_counter() - started:.1f} s")
    engine = create_engine(url)
    sessionmaker = create_sessionmaker(engine)
    query_vectors = rng.standard_normal((queries, DIMS)).astype(np.float32)
    query_vectors /= np.linalg.norm(query_vectors, axis=1, keepdims=True)
    # Visible is built directly from space ids: grants are not what is measured here.

    await _global_index(engine)

    for fraction in FRACTIONS:
        allowed = tuple(spaces[: max(1, int(len(spaces) * fraction))])
        scope = Visible.of_spaces(tenant, Action.READ, allowed)

        def naive_params(
            query: list[float], allowed: tuple[uuid.UUID, ...] = allowed
        ) -> dict[str, object]:
            return {"t": tenant, "s": list(allowed), "q": str(query), "k": k}

        exact = Result(f"memgate exact, {fraction:.1%} visible", [], 0, 1.0)
        naive = Result(f"global HNSW + filter, {fraction:.1%} visible", [], 0, 0.0)
        iterative = Result(f"HNSW iterative scan, {fraction:.1%} visible", [], 0, 0.0)
        hits = iterative_hits = 0
        truths: list[set[uuid.UUID]] = []
        for vector in query_vectors:
            as_list = vector.tolist()
            # Each timing includes a session, pool checkout and transaction, as a request has.
            t0 = time.perf_counter()
            async with sessionmaker() as session:
                found = await search(session, scope, as_list, MemoryFilters(), k=k, min_score=None)
            exact.latencies_ms.append((time.perf_counter() - t0) * 1000)
            truth = {row.id for row, _ in found}
            truths.append(truth)
            exact.short += len(found) < k
            t0 = time.perf_counter()
            async with sessionmaker() as session:
                naive_rows = (await session.execute(NAIVE, naive_params(as_list))).all()
            naive.latencies_ms.append((time.perf_counter() - t0) * 1000)
            naive.short += len(naive_rows) < k
            hits += len(truth & {row.id for row in naive_rows})
            t0 = time.perf_counter()
            async with sessionmaker() as session, session.begin():
                for setting in ITERATIVE_SETTINGS:
                    await session.execute(text(setting))
                iterative_rows = (await session.execute(ITERATIVE, naive_params(as_list))).all()
            iterative.latencies_ms.append((time.perf_counter() - t0) * 1000)
            iterative.short += len(iterative_rows) < k
            iterative_hits += len(truth & {row.id for row in iterative_rows})
        naive.recall = hits / (k * queries)
        iterative.recall = iterative_hits / (k * queries)
        partial = await _partial_index(engine, tenant, allowed, query_vectors, truths, k)
        print(exact.row())
        print(naive.row())
        print(iterative.row())
        print(partial.row())
        ratio = statistics.median(naive.latencies_ms) / statistics.median(exact.latencies_ms)
        print(f"  naive/exact p50 ratio {ratio:.2f}")
    await engine.dispose()


async def _global_index(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        started = time.perf_counter()
        await conn.execute(
            text("CREATE INDEX bench_hnsw ON memories USING hnsw (embedding vector_cosine_ops)")
        )
        print(f"global HNSW index built in {time.perf_counter() - started:.1f} s")


async def _partial_index(
    engine: AsyncEngine,
    tenant: uuid.UUID,
    allowed: tuple[uuid.UUID, ...],
    query_vectors: np.ndarray,
    truths: list[set[uuid.UUID]],
    k: int,
) -> Result:
    """An HNSW index holding only this visible set (a partial index per grant set): the
    predicate is spelled out literally, or the planner cannot match the index to the query."""
    spaces = "ARRAY[" + ",".join(f"'{space}'::uuid" for space in allowed) + "]"
    where = f"space_id = ANY({spaces}) AND superseded_at IS NULL AND revoked_at IS NULL"
    async with engine.begin() as conn:
        started = time.perf_counter()
        await conn.execute(
            text(
                "CREATE INDEX bench_partial ON memories "
                f"USING hnsw (embedding vector_cosine_ops) WHERE {where}"
            )
        )
        built = time.perf_counter() - started
    label = f"partial HNSW ({built:.0f} s build), {len(allowed)} spaces"
    result = Result(label, [], 0, 0.0)
    query = text(
        f"SELECT id FROM memories WHERE tenant_id = :t AND {where} "
        "ORDER BY embedding <=> CAST(:q AS vector) LIMIT :k"
    )
    hits = 0
    for vector, truth in zip(query_vectors, truths, strict=True):
        t0 = time.perf_counter()
        async with engine.connect() as conn:
            rows = (
                await conn.execute(query, {"t": tenant, "q": str(vector.tolist()), "k": k})
            ).all()
        result.latencies_ms.append((time.perf_counter() - t0) * 1000)
        result.short += len(rows) < k
        hits += len(truth & {row.id for row in rows})
    result.recall = hits / (k * len(truths))
    async with engine.begin() as conn:
        await conn.execute(text("DROP INDEX bench_partial"))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=40)
    parser.add_argument("--k", type=int, default=10)
    args = parser.parse_args()
    with bench_database() as url:
        asyncio.run(run(url, args.rows, args.queries, args.k))


if __name__ == "__main__":
    main()
