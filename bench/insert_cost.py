"""What one memory row costs to insert, by index: the HNSW vector index against the rest.

    .venv/bin/python -m bench.insert_cost [--rows 2000] [--rounds 3]

On a migrated scratch database (bench/database.py), COPYs the same `--rows` rows (sentences
like agents store, bench/corpus.py, embedded by the offline WordLlama model: random vectors
are the worst case for a graph index, not what memgate serves) into three copies of the `memories`
table: with every index of `memories` (`LIKE memories INCLUDING ALL`), the same without the
HNSW index, and with the primary key only. (Copies, because COPY FROM is refused on a table
with row-level security, and they carry no triggers, so only the index maintenance differs.)
Prints the best of `--rounds` per table, in µs per row, and the HNSW index's share: the floor
under any batch write, whatever it batches.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from datetime import UTC, datetime

import psycopg

from bench.corpus import sentences
from bench.database import bench_database
from service.embeddings.wordllama import WordLlamaEmbedder

COLUMNS = (
    "tenant_id, id, space_id, owner_id, writer_id, client_id, subject, kind, key, value, "
    "content_hash, embedding, embedding_model, recorded_at, valid_from"
)


def _rows(count: int) -> list[tuple[object, ...]]:
    tenant, space, writer, now = uuid.uuid4(), uuid.uuid4(), uuid.uuid4(), datetime.now(UTC)
    texts = sentences(count, seed=14)
    vectors = asyncio.run(WordLlamaEmbedder().embed(texts))
    made: list[tuple[object, ...]] = []
    for i, (value, vector) in enumerate(zip(texts, vectors, strict=True)):
        text = "[" + ",".join(map(repr, vector)) + "]"
        made.append(
            (
                tenant,
                uuid.uuid4(),
                space,
                writer,
                writer,
                "bench",
                f"user:{i % 97}",
                "fact",
                f"bench.{i}",
                value,
                i.to_bytes(32, "big"),
                text,
                "bench",
                now,
                now,
            )
        )
    return made


def _table(conn: psycopg.Connection, name: str, drop: tuple[str, ...] | None) -> None:
    conn.execute(f"DROP TABLE IF EXISTS {name}")
    if drop is None:
        conn.execute(f"CREATE TABLE {name} (LIKE memories INCLUDING DEFAULTS INCLUDING GENERATED)")
        conn.execute(f"ALTER TABLE {name} ADD PRIMARY KEY (tenant_id, id)")
        return
    conn.execute(f"CREATE TABLE {name} (LIKE memories INCLUDING ALL)")
    for method in drop:
        for (index,) in conn.execute(
            "SELECT indexname FROM pg_indexes WHERE tablename = %s AND indexdef LIKE %s",
            (name, f"%USING {method} %"),
        ).fetchall():
            conn.execute(f'DROP INDEX "{index}"')


def _copy(conn: psycopg.Connection, name: str, rows: list[tuple[object, ...]]) -> float:
    conn.execute(f"TRUNCATE {name}")
    started = time.perf_counter()
    with conn.cursor().copy(f"COPY {name} ({COLUMNS}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row(row)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows = _rows(args.rows)
    tables = {
        "every index": ("with_all", ()),
        "no HNSW": ("without_hnsw", ("hnsw",)),
        "primary key only": ("pk_only", None),
    }
    best: dict[str, float] = {}
    with bench_database() as url, psycopg.connect(url, autocommit=True) as conn:
        for label, (name, drop) in tables.items():
            _table(conn, f"bench_{name}", drop)
            best[label] = min(_copy(conn, f"bench_{name}", rows) for _ in range(args.rounds))
    print(f"{'table':<18} {'rows':>6} {'µs/row':>8}")
    for label, seconds in best.items():
        print(f"{label:<18} {args.rows:>6} {seconds / args.rows * 1e6:>8.0f}")
    hnsw = (best["every index"] - best["no HNSW"]) / args.rows
    print(
        f"HNSW index: {hnsw * 1e6:.0f} µs/row, {hnsw / (best['every index'] / args.rows):.0%} "
        f"of a row's insert: at most {1 / hnsw:.0f} rows/s from it alone"
    )


if __name__ == "__main__":
    main()
