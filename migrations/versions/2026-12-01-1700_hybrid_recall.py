"""The lexical leg of hybrid recall: lexemes in the writer's tenant's language, and a full-text
index led by the tenant and partial on live rows.

- `lexical_config regconfig` (default `simple`): the text search configuration a row's lexemes
  were made with, taken from the tenant's `text_search_config` setting when the row is written.
  `lexical` is now `to_tsvector(lexical_config, value)`, so a row's lexemes always agree with
  the configuration it names, and rows made under an earlier language can be found later.
- `ix_memories_lexical` becomes a GIN index over `(tenant_id, lexical)` (`btree_gin` gives GIN
  the uuid opclass) with the liveness condition of the HNSW and covering indexes. The old index
  held every version of every tenant, so a search's lexical leg read other tenants' postings
  and dead versions'; now the tenant key is intersected inside the index and superseded or
  revoked rows are not in it. `btree_gin` is a trusted extension: a database owner without
  superuser may create it, and using the index needs no grant.

Changing the generated expression rewrites `memories` once (ALTER ... SET EXPRESSION).

Revision ID: 20261201_hybrid_recall
Revises: 20261201_tenants_lifecycle
Create Date: 2026-12-01 17:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "20261201_hybrid_recall"
down_revision: str | Sequence[str] | None = "20261201_space_gates"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

LIVE = "superseded_at IS NULL AND revoked_at IS NULL"


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute("CREATE EXTENSION IF NOT EXISTS btree_gin")
    op.execute("DROP INDEX ix_memories_lexical")
    op.execute("ALTER TABLE memories ADD COLUMN lexical_config regconfig NOT NULL DEFAULT 'simple'")
    op.execute(
        "ALTER TABLE memories ALTER COLUMN lexical "
        "SET EXPRESSION AS (to_tsvector(lexical_config, value))"
    )
    op.execute(
        f"CREATE INDEX ix_memories_lexical ON memories USING gin (tenant_id, lexical) WHERE {LIVE}"
    )


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute("DROP INDEX ix_memories_lexical")
    op.execute(
        "ALTER TABLE memories ALTER COLUMN lexical "
        "SET EXPRESSION AS (to_tsvector('simple'::regconfig, value))"
    )
    op.execute("ALTER TABLE memories DROP COLUMN lexical_config")
    op.execute("CREATE INDEX ix_memories_lexical ON memories USING gin (lexical)")
    # btree_gin stays: another schema object may use it, and it holds no data.
