"""Memories loaded straight into the table (COPY) for tests that need a large visible set
without embedding and writing each row through the API."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import psycopg

__all__ = ["copy_memories"]

HNSW_INDEX = "ix_memories_embedding_hnsw"


def copy_memories(url: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """COPY `rows` into memories as the owner, then ANALYZE.

    The HNSW index is dropped for the load and made again from its own definition, in one
    transaction: pgvector builds a graph in bulk many times faster than it inserts row by row,
    and the table ends with the same index (name, operator class, m, ef_construction) the
    migrations made."""
    with psycopg.connect(url) as conn:
        found = conn.execute(
            "SELECT indexdef FROM pg_indexes WHERE tablename = 'memories' AND indexname = %s",
            (HNSW_INDEX,),
        ).fetchone()
        assert found is not None, f"{HNSW_INDEX} is missing: the migrations changed"
        conn.execute(f"DROP INDEX {HNSW_INDEX}")
        with conn.cursor().copy(f"COPY memories ({', '.join(columns)}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
        conn.execute(found[0])
        conn.commit()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ANALYZE memories")
