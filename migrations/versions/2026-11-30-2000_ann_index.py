"""An HNSW index over live memories' embeddings (the approximate search path), and a narrow
index that sizes a caller's visible set (which picks the path, and answers counts).

Search ranks exactly while the caller's visible set is small (service/memory/service.py picks
the path per query); past `MEMGATE_SEARCH_EXACT_MAX_ROWS` visible rows it walks this index with
pgvector's iterative scan instead. Partial on live rows like the covering scan index, so
superseded and revoked versions neither cost space nor crowd the walk. Sizing the visible set
through the covering scan index would read every visible vector (about 1 KB a row: 44 ms for
20,000 rows in bench/search.py); the narrow index holds only what Visible checks.

Revision ID: 20261130_ann_index
Revises: 20261130_live_key
Create Date: 2026-11-30 20:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "20261130_ann_index"
down_revision: str | Sequence[str] | None = "20261130_live_key"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

LIVE = "superseded_at IS NULL AND revoked_at IS NULL"


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(
        "CREATE INDEX ix_memories_embedding_hnsw ON memories "
        "USING hnsw (embedding vector_cosine_ops) WITH (m = 16, ef_construction = 64) "
        f"WHERE {LIVE}"
    )
    op.execute(
        "CREATE INDEX ix_memories_visible_count ON memories (tenant_id, space_id) "
        f"INCLUDE (expires_at, read_requires) WHERE {LIVE}"
    )


def downgrade() -> None:
    op.execute("DROP INDEX ix_memories_visible_count")
    op.execute("DROP INDEX ix_memories_embedding_hnsw")
