"""Filtered search at several visible fractions of one 100k-row tenant: memgate's exact path,
its approximate path (the HNSW walk with iterative scan), the per-query choice between them
that the service makes, a global HNSW index with the permission filter and no iterative scan
(the naive design), and a partial HNSW index built for exactly the visible set.

    .venv/bin/python -m bench.search [--rows 100000] [--queries 40] [--k 10] [--vectors text]
                                     [--any-model]

`--vectors text` (the default) embeds generated sentences with the offline WordLlama model,
so vectors cluster by topic as real memories do; `--vectors random` loads random unit vectors,
the worst case for any graph index. Starts its own embedded PostgreSQL (or uses DATABASE_URL),
loads with COPY, builds the migration's HNSW index, and prints p50/p95 latency, how many
queries came back short of k, recall@k against the exact answer (a hit counts when it is at
least as near as the k-th exact hit, so ties do not count as misses), and for the service's
choice, which path it took. Medians, not single runs: the machine is shared.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import psycopg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from bench.corpus import sentences
from bench.database import bench_database
from service.calls import Facts
from service.db.session import create_engine, create_sessionmaker
from service.embeddings.wordllama import WordLlamaEmbedder
from service.memory.repository import (
    AnnTuning,
    Hit,
    MemoryFilters,
    search_approximate,
    search_exact,
)
from service.memory.service import MemoryService
from service.policy.visible import Action, Visible
from service.settings import MemorySettings

DIMS = 256
N_SPACES = 1000
FRACTIONS = (0.001, 0.01, 0.1, 0.5)
PARTIAL_UP_TO = 0.1
"""Partial indexes are built only up to this fraction (a 50k-row build takes minutes here)."""
HNSW = "ix_memories_embedding_hnsw"
# The naive design: one global ANN index, the permission filter in the same WHERE, no
# iterative scan (the index returns ef_search candidates and the filter thins them out).
NAIVE = text(
    "SELECT id, embedding <=> CAST(:q AS vector) AS distance FROM memories "
    "WHERE tenant_id = :t AND space_id = ANY(:s) AND superseded_at IS NULL "
    "AND revoked_at IS NULL ORDER BY embedding <=> CAST(:q AS vector) LIMIT :k"
)

Hits = list[tuple[uuid.UUID, float]]
"""(id, cosine distance), nearest first."""
Search = Callable[[AsyncSession, list[float]], Awaitable[tuple[Hits, str]]]


@dataclass
class Result:
    label: str
    latencies_ms: list[float] = field(default_factory=list)
    short: int = 0
    found: int = 0
    asked: int = 0
    paths: Counter[str] = field(default_factory=Counter)

    def row(self) -> str:
        p50 = statistics.median(self.latencies_ms)
        p95 = statistics.quantiles(self.latencies_ms, n=20)[18]
        paths = ", ".join(f"{path} {n}" for path, n in sorted(self.paths.items()))
        return (
            f"  {self.label:<34} p50 {p50:8.2f} ms  p95 {p95:8.2f} ms  short {self.short:3d}  "
            f"recall {self.found / self.asked:.3f}" + (f"  ({paths})" if paths else "")
        )


def _vector_text(vector: np.ndarray) -> str:
    return "[" + ",".join(f"{v:.7f}" for v in vector) + "]"


async def _vectors(kind: str, count: int, seed: int) -> np.ndarray:
    if kind == "random":
        rng = np.random.default_rng(seed)
        vectors = rng.standard_normal((count, DIMS)).astype(np.float32)
    else:
        embedded = await WordLlamaEmbedder().embed(sentences(count, seed))
        vectors = np.asarray(embedded, dtype=np.float32)
    normalized: np.ndarray = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    return normalized


def load(url: str, vectors: np.ndarray) -> tuple[uuid.UUID, list[uuid.UUID]]:
    """One tenant; rows dealt round-robin over 1,000 spaces, so unions of spaces hit each
    visible fraction and the visible rows are spread over every topic. The HNSW index is
    dropped for the load and rebuilt from its own definition (a bulk build beats 100k inserts)."""
    tenant, owner = uuid.uuid4(), uuid.uuid4()
    spaces = [uuid.uuid4() for _ in range(N_SPACES)]
    with psycopg.connect(url, autocommit=True) as conn:
        definition = conn.execute(
            "SELECT indexdef FROM pg_indexes WHERE indexname = %s", (HNSW,)
        ).fetchone()
        assert definition is not None, "the migration's HNSW index is missing"
        conn.execute(f"DROP INDEX {HNSW}")
        conn.execute("INSERT INTO tenants (tenant_id, name) VALUES (%s, 'bench')", (tenant,))
        with conn.cursor().copy("COPY spaces (tenant_id, id, kind, name) FROM STDIN") as copy:
            for space in spaces:
                copy.write_row((tenant, space, "team", str(space)))
        columns = (
            "tenant_id, id, space_id, owner_id, writer_id, client_id, subject, kind, key, "
            "value, content_hash, embedding, embedding_model"
        )
        with conn.cursor().copy(f"COPY memories ({columns}) FROM STDIN") as copy:
            for i, vector in enumerate(vectors):
                space = spaces[i % N_SPACES]
                fields = (tenant, uuid.uuid4(), space, owner, owner, "bench", "s", "fact")
                copy.write_row((*fields, f"k{i}", "v", b"h", _vector_text(vector), BENCH_MODEL))
        started = time.perf_counter()
        conn.execute("SET maintenance_work_mem = '2GB'")
        conn.execute(definition[0])
        print(f"HNSW index built in {time.perf_counter() - started:.1f} s")
        conn.execute("VACUUM ANALYZE memories")
    return tenant, spaces


def _recall(truth: Hits, hits: Hits, k: int) -> int:
    """Hits at least as near as the k-th exact one (ties are not misses)."""
    if len(truth) < k:
        return len({i for i, _ in truth} & {i for i, _ in hits})
    kth = truth[k - 1][1]
    return sum(1 for _, distance in hits[:k] if distance <= kth + 1e-6)


BENCH_MODEL = "bench"
"""The `embedding_model` every loaded row records: the service's searches rank only rows of
the query's model (`MemoryFilters.embedding_model`), so the strategies ask for it too."""


def _strategies(
    tenant: uuid.UUID, allowed: tuple[uuid.UUID, ...], k: int, any_model: bool = False
) -> dict[str, Search]:
    scope = Visible.of_spaces(tenant, Action.READ, allowed)
    limits = MemorySettings()
    embedder = WordLlamaEmbedder()  # unused by `rank`, which gets the vector
    tuning = AnnTuning(limits.ann_ef_search, limits.ann_max_scan_tuples)
    # `--any-model`: without the model test, the statements as they were before issue 13.
    no_filters = MemoryFilters(embedding_model=None if any_model else BENCH_MODEL)

    def as_hits(rows: Sequence[Hit]) -> Hits:
        return [(row.id, 1.0 - score) for row, score in rows]

    async def exact(session: AsyncSession, q: list[float]) -> tuple[Hits, str]:
        rows = await search_exact(session, scope, q, no_filters, k=k, min_score=None)
        return as_hits(rows), ""

    async def approximate(session: AsyncSession, q: list[float]) -> tuple[Hits, str]:
        rows = await search_approximate(session, scope, q, no_filters, k=k, tuning=tuning)
        return as_hits(rows), ""

    async def chosen(session: AsyncSession, q: list[float]) -> tuple[Hits, str]:
        service = MemoryService(session, embedder, limits, facts=Facts())
        rows, path = await service.rank(scope, q, no_filters, k, None)
        return as_hits(rows), path

    async def naive(session: AsyncSession, q: list[float]) -> tuple[Hits, str]:
        params = {"t": tenant, "s": list(allowed), "q": str(q), "k": k}
        return [(r.id, r.distance) for r in await session.execute(NAIVE, params)], ""

    return {
        "memgate exact": exact,
        "memgate approximate (HNSW walk)": approximate,
        "memgate per-query choice": chosen,
        "global HNSW + filter (naive)": naive,
    }


async def _measure(
    sessionmaker: async_sessionmaker[AsyncSession],
    label: str,
    search: Search,
    queries: np.ndarray,
    truths: list[Hits],
    k: int,
) -> Result:
    result = Result(label)
    for vector, truth in zip(queries, truths, strict=True):
        # Each timing includes a session, pool checkout and transaction, as a request has.
        t0 = time.perf_counter()
        async with sessionmaker() as session, session.begin():
            hits, path = await search(session, vector.tolist())
        result.latencies_ms.append((time.perf_counter() - t0) * 1000)
        result.short += len(hits) < k
        result.found += _recall(truth, hits, k)
        result.asked += min(k, len(truth))
        if path:
            result.paths[path] += 1
    return result


async def run(
    url: str, rows: int, queries: int, k: int, kind: str, any_model: bool = False
) -> None:
    started = time.perf_counter()
    vectors = await _vectors(kind, rows + queries, seed=7)
    tenant, spaces = load(url, vectors[:rows])
    print(f"{kind} vectors: loaded {rows} rows in {time.perf_counter() - started:.1f} s")
    query_vectors = vectors[rows:]
    engine = create_engine(url)
    sessionmaker = create_sessionmaker(engine)
    # Visible is built directly from space ids: grants are not what is measured here.
    for fraction in FRACTIONS:
        allowed = tuple(spaces[: max(1, int(len(spaces) * fraction))])
        strategies = _strategies(tenant, allowed, k, any_model)
        truths: list[Hits] = []
        for vector in query_vectors:
            async with sessionmaker() as session, session.begin():
                truths.append((await strategies["memgate exact"](session, vector.tolist()))[0])
        print(f"{fraction:.1%} visible ({int(rows * len(allowed) / N_SPACES)} rows)")
        for label, search in strategies.items():
            print((await _measure(sessionmaker, label, search, query_vectors, truths, k)).row())
        if fraction <= PARTIAL_UP_TO:
            print((await _partial_index(engine, sessionmaker, tenant, allowed, query_vectors,
                                        truths, k)).row())  # fmt: skip
    await engine.dispose()


async def _partial_index(
    engine: AsyncEngine,
    sessionmaker: async_sessionmaker[AsyncSession],
    tenant: uuid.UUID,
    allowed: tuple[uuid.UUID, ...],
    queries: np.ndarray,
    truths: list[Hits],
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
    query = text(
        f"SELECT id, embedding <=> CAST(:q AS vector) AS distance FROM memories "
        f"WHERE tenant_id = :t AND {where} ORDER BY embedding <=> CAST(:q AS vector) LIMIT :k"
    )

    async def partial(session: AsyncSession, q: list[float]) -> tuple[Hits, str]:
        found = await session.execute(query, {"t": tenant, "q": str(q), "k": k})
        return [(r.id, r.distance) for r in found], ""

    label = f"partial HNSW ({built:.1f} s build)"
    result = await _measure(sessionmaker, label, partial, queries, truths, k)
    async with engine.begin() as conn:
        await conn.execute(text("DROP INDEX bench_partial"))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=40)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--vectors", choices=("text", "random"), default="text")
    parser.add_argument(
        "--any-model",
        action="store_true",
        help="rank rows of any embedding model (the statements before issue 13), for comparison",
    )
    args = parser.parse_args()
    with bench_database() as url:
        asyncio.run(run(url, args.rows, args.queries, args.k, args.vectors, args.any_model))


if __name__ == "__main__":
    main()
