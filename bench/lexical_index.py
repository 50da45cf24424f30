"""The lexical leg's index: what a small tenant's full-text match costs beside a large tenant
whose rows hold the same words, with the index the hybrid-recall migration builds (GIN over
`(tenant_id, lexical)`, partial on live rows) against the one it replaced (GIN over `lexical`
alone, every version of every tenant).

    .venv/bin/python -m bench.lexical_index [--large 50000] [--small 200] [--runs 30]

Loads both tenants by COPY (random vectors: only the lexemes matter here), superseded copies
of the large tenant's rows included, then times the leg's index question (the small tenant's
live rows matching a common and a rare term) under each index, and prints medians, shared
buffers read, and the plan. Starts its own embedded PostgreSQL (or uses DATABASE_URL).
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from typing import Any

import numpy as np
import psycopg

from bench.database import bench_database

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


def _load(conn: psycopg.Connection[Any], tenant: uuid.UUID, rows: int, superseded: bool) -> None:
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


def run(url: str, large: int, small: int, runs: int) -> None:
    big, little = uuid.uuid4(), uuid.uuid4()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP INDEX IF EXISTS ix_memories_embedding_hnsw")  # not asked here
        _load(conn, big, large, superseded=True)
        _load(conn, little, small, superseded=False)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--large", type=int, default=50_000)
    parser.add_argument("--small", type=int, default=200)
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    with bench_database() as url:
        run(url, args.large, args.small, args.runs)


if __name__ == "__main__":
    main()
