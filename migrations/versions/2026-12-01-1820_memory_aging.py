"""Memory aging and re-embedding (issue 13): where last recalls are kept, and a search index
that knows each vector's model.

- `memory_recalls(tenant_id, memory_id, recalled_on)`: the day a memory was last returned by a
  search or a get, written in batches by service/memory/recalls.py (never by the search's own
  transaction) and read by `memory.age_unused`. Ids and dates only. Row-level security by
  tenant, like the quota tables: the flusher names the tenant, not a principal (a recall says
  nothing a reader could not see, and noting it needs no grant). No foreign key to `memories`:
  a batch must not fail because a memory it names was swept meanwhile; a swept memory's
  recall row is only an id and a day, and goes with its tenant.
- Deleting a tenant (`memgate_retire_tenant`, which keeps the `tenants` row, so the cascade
  never fires) deletes its recall rows too: the function gets one `DELETE` more, inserted
  into its current definition (and taken out again on downgrade), so its other steps stay as
  migration `tenants_lifecycle` wrote them.
- `ix_memories_visible_scan` also holds `embedding_model`: the vector leg of a search ranks
  only rows embedded by the query's model (a re-embedding run leaves some rows on the old
  one), and that test must not send the exact scan to the heap.

Revision ID: 20261201_memory_aging
Revises: 20261201_retract_only_stubs
Create Date: 2026-12-01 18:20:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "20261201_memory_aging"
down_revision: str | Sequence[str] | None = "20261201_job_runs"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

APP_ROLE = "memgate_app"
TENANT = "tenant_id = (SELECT memgate_tenant())"
LIVE = "superseded_at IS NULL AND revoked_at IS NULL"

RECALLS = f"""
CREATE TABLE memory_recalls (
    tenant_id uuid NOT NULL,
    memory_id uuid NOT NULL,
    recalled_on date NOT NULL,
    CONSTRAINT pk_memory_recalls PRIMARY KEY (tenant_id, memory_id),
    CONSTRAINT fk_memory_recalls_tenant_id_tenants FOREIGN KEY (tenant_id)
        REFERENCES tenants (tenant_id) ON DELETE CASCADE
);
GRANT SELECT, INSERT, UPDATE, DELETE ON memory_recalls TO {APP_ROLE};
ALTER TABLE memory_recalls ENABLE ROW LEVEL SECURITY;
CREATE POLICY memory_recalls_tenant ON memory_recalls TO {APP_ROLE}
    USING ({TENANT}) WITH CHECK ({TENANT});
"""


USAGE_STEP = "DELETE FROM tenant_usage WHERE tenant_id = p_tenant;"
RECALLS_STEP = "DELETE FROM memory_recalls WHERE tenant_id = p_tenant;"


def _retire_tenant(find: str, put: str) -> str:
    """Redefine `memgate_retire_tenant` with `find` replaced by `put` (refusing if absent)."""
    return f"""
DO $migration$
DECLARE
    definition text := pg_get_functiondef('memgate_retire_tenant(uuid)'::regprocedure);
BEGIN
    IF position('{find}' IN definition) = 0 THEN
        RAISE EXCEPTION 'memgate_retire_tenant does not hold the expected step';
    END IF;
    EXECUTE replace(definition, '{find}', '{put}');
END
$migration$;
"""


def _scan_index(*included: str) -> str:
    return (
        "CREATE INDEX ix_memories_visible_scan ON memories (tenant_id, space_id) "
        f"INCLUDE ({', '.join(included)}) WHERE {LIVE}"
    )


BEFORE = ("id", "expires_at", "read_requires", "embedding")
AFTER = (*BEFORE, "embedding_model")


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(RECALLS)
    op.execute(_retire_tenant(USAGE_STEP, f"{USAGE_STEP}\n    {RECALLS_STEP}"))
    op.execute("DROP INDEX ix_memories_visible_scan")
    op.execute(_scan_index(*AFTER))


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute("DROP INDEX ix_memories_visible_scan")
    op.execute(_scan_index(*BEFORE))
    op.execute(_retire_tenant(f"{USAGE_STEP}\n    {RECALLS_STEP}", USAGE_STEP))
    op.execute("DROP TABLE memory_recalls")
