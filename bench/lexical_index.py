"""The lexical leg's index: what a small tenant's full-text match costs beside a large tenant
whose rows hold the same words, with the index the hybrid-recall migration builds (GIN over
`(tenant_id, lexical)`, partial on live rows) against the one it replaced (GIN over `lexical`
alone, every version of every tenant).

    .venv/bin/python -m bench.lexical_index [--large 50000] [--small 200] [--mid 10000]
        [--runs 30]

Loads both tenants by COPY (random vectors: only the lexemes matter here), superseded copies
of the large tenant's rows included, then times the leg's index question (the small tenant's
live rows matching a common and a rare term) under each index, and prints medians, shared
buffers read, and the plan. Then what the lexical leg adds to a whole search statement: the
hybrid statement (`repository.search_fused_within`, floor off) against the vector one
(`search_exact_within`) for the small tenant and a `--mid`-row one, with a query whose words are
in every row (the leg's worst case) and one with a rare word. Starts its own embedded
PostgreSQL (or uses DATABASE_URL).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from typing import Any

import numpy as np
import psycopg

from bench.database import bench_database
from service.db.session import create_engine, create_sessionmaker
from service.memory.repository import (
    Fusion,
    MemoryFilters,
    search_exact_within,
    search_fused_within,
)
from service.policy.visible import Action, Visible

NEW = (
    "CREATE INDEX ix_memories_lexical ON memories USING gin (tenant_id, lexical) "
    "WHERE superseded_at IS NULL AND revoked_at IS NULL"
)
OLD = "CREATE INDEX ix_memories_lexical ON memories USING gin (lexical)"
QUESTION = (
    "SELECT count(*) FROM memories WHERE tenant_id = %(t)s AND lexical @@ %(q)s::tsquery "
    "AND superseded_at IS NULL AND revoked_at IS NULL"
)
TERMS = {"common": "deploy | window", "rare": "zebra"}


def _load(
    conn: psycopg.Connection[Any], tenant: uuid.UUID, rows: int, superseded: bool
) -> uuid.UUID:
    space, owner = uuid.uuid4(), uuid.uuid4()
    conn.execute("INSERT INTO tenants (tenant_id, name) VALUES (%s, 'bench')", (tenant,))
    conn.execute(
        "INSERT INTO spaces (tenant_id, id, kind, name) VALUES (%s, %s, 'team', 's')",
        (tenant, space),
    )
    vector = "[" + ",".join(str(x) for x in np.random.default_rng(1).standard_normal(256)) + "]"
    columns = (
        "tenant_id, id, space_id, owner_id, writer_id, client_id, subject, kind, key, value, "
        "content_hash, embedding, embedding_model, superseded_at"
    )
    with conn.cursor().copy(f"COPY memories ({columns}) FROM STDIN") as copy:
        for i in range(rows):
            word = "zebra" if i % 50 == 0 else "giraffe"
            value = f"the deploy window of service {i} is friday, {word} note"
            closed = "2026-01-01" if superseded and i % 2 else None
            fields = (tenant, uuid.uuid4(), space, owner, owner, "bench", "s", "fact", f"k{i}")
            copy.write_row((*fields, value, b"h", vector, "bench", closed))
    return space


STATEMENT_QUERIES = {
    "words in every row": "when is the deploy window of service 42",
    "a rare word": "which note says zebra",
}


async def _statements(url: str, tenants: dict[str, tuple[uuid.UUID, uuid.UUID]], runs: int) -> None:
    vector = np.random.default_rng(2).standard_normal(256).tolist()
    engine = create_engine(url)
    async with create_sessionmaker(engine)() as session, session.begin():
        for label, (tenant, space) in tenants.items():
            scope = Visible.of_spaces(tenant, Action.READ, [space])
            for name, query in STATEMENT_QUERIES.items():
                fusion = Fusion(query, "english", 100, None, None)
                timings: dict[str, list[float]] = {"vector": [], "hybrid": []}
                for _ in range(runs + 1):  # the first round warms up and is dropped
                    started = time.perf_counter()
                    await search_exact_within(
                        session,
                        scope,
                        vector,
                        MemoryFilters(),
                        k=10,
                        min_score=None,
                        size_limit=20_000,
                        count_limit=50_000,
                    )
                    timings["vector"].append((time.perf_counter() - started) * 1000)
                    started = time.perf_counter()
                    await search_fused_within(
                        session,
                        scope,
                        vector,
                        MemoryFilters(),
                        fusion,
                        k=10,
                        size_limit=20_000,
                        count_limit=50_000,
                    )
                    timings["hybrid"].append((time.perf_counter() - started) * 1000)
                vector_ms = statistics.median(timings["vector"][1:])
                hybrid_ms = statistics.median(timings["hybrid"][1:])
                print(
                    f"  {label:<22} {name:<19} vector p50 {vector_ms:6.2f} ms  "
                    f"hybrid p50 {hybrid_ms:6.2f} ms ({hybrid_ms / vector_ms:.1f}x)"
                )
    await engine.dispose()


def _measure(conn: psycopg.Connection[Any], tenant: uuid.UUID, runs: int) -> None:
    for name, query in TERMS.items():
        params = {"t": tenant, "q": query}
        samples = []
        for _ in range(runs):
            started = time.perf_counter()
            conn.execute(QUESTION, params).fetchone()
            samples.append((time.perf_counter() - started) * 1000)
        plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + QUESTION, params)
        root = plan.fetchone()[0][0]["Plan"]  # type: ignore[index]
        buffers = root["Shared Hit Blocks"] + root["Shared Read Blocks"]
        print(
            f"  {name:<7} p50 {statistics.median(samples):6.2f} ms  buffers {buffers:6d}  "
            f"matches {conn.execute(QUESTION, params).fetchone()[0]}"  # type: ignore[index]
        )


def run(url: str, large: int, small: int, mid: int, runs: int) -> None:
    big, little, middle = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP INDEX IF EXISTS ix_memories_embedding_hnsw")  # not asked here
        _load(conn, big, large, superseded=True)
        little_space = _load(conn, little, small, superseded=False)
        middle_space = _load(conn, middle, mid, superseded=False)
        conn.execute("VACUUM ANALYZE memories")
        for label, definition in (("new (tenant_id, lexical), live", NEW), ("old (lexical)", OLD)):
            conn.execute("DROP INDEX IF EXISTS ix_memories_lexical")
            conn.execute(definition)
            conn.execute("ANALYZE memories")
            size = conn.execute(
                "SELECT pg_size_pretty(pg_relation_size('ix_memories_lexical'))"
            ).fetchone()
            print(f"index {label}: {size[0] if size else '?'}")
            print(f" small tenant ({small} rows) beside a large one ({large} rows, half closed):")
            _measure(conn, little, runs)
            print(f" large tenant ({large} rows):")
            _measure(conn, big, runs)
        conn.execute("DROP INDEX ix_memories_lexical")
        conn.execute(NEW)
        plan = conn.execute("EXPLAIN " + QUESTION, {"t": little, "q": TERMS["common"]}).fetchall()
        print("plan (new index):")
        for (line,) in plan:
            print("  " + line)
    print("search statements (k=10, floor off, exact path):")
    tenants = {
        f"{small} visible rows": (little, little_space),
        f"{mid} visible rows": (middle, middle_space),
    }
    asyncio.run(_statements(url, tenants, runs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--large", type=int, default=50_000)
    parser.add_argument("--small", type=int, default=200)
    parser.add_argument("--mid", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    with bench_database() as url:
        run(url, args.large, args.small, args.mid, args.runs)


if __name__ == "__main__":
    main()
