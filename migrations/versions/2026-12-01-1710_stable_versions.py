"""Stable version numbers: DELETE retracts a version instead of removing its row (issue 12).

- `memories.retracted_at`: when the version was retracted. A retracted row is a content-free
  stub (value '', no embedding, content hash, metadata or source) that keeps its id, number,
  key and chain links, so a number is never issued twice and history can show the gap.
- `memories.embedding` may be NULL (a stub has none). Stubs are closed (`superseded_at` set),
  so they stay out of every partial live index (HNSW, the covering scan, the live key).
- `memories_retract`: an UPDATE policy for principals holding delete (not write) on the space.
  It admits only rows that come out as content-free stubs, so delete never lends write.
- The usage trigger counts neither a stub nor its bytes: retracting frees quota as the hard
  delete did.

Downgrade removes the stubs (and the links that name them): their numbers may be issued again
after it, as before this revision.

Revision ID: 20261201_stable_versions
Revises: 20261201_tenants_lifecycle
Create Date: 2026-12-01 17:10:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "20261201_stable_versions"
down_revision: str | Sequence[str] | None = "20261201_tenants_lifecycle"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

APP_ROLE = "memgate_app"
TENANT = "tenant_id = (SELECT memgate_tenant())"
DELETER = (
    f"{TENANT} AND space_id = ANY (CAST((SELECT memgate_granted('delete')) AS uuid[])) "
    "AND space_id = ANY (CAST((SELECT memgate_granted('read')) AS uuid[])) "
    "AND read_requires <@ (SELECT memgate_granted('read'))"
)
STUB = (
    "retracted_at IS NOT NULL AND value = '' AND embedding IS NULL AND source IS NULL "
    "AND metadata = '{}'::jsonb AND octet_length(content_hash) = 0"
)
"""What a row a deleter (without write) leaves behind must look like: a stub, nothing else."""
STRIPES = 16


def _counter(stored: str, rows: str) -> str:
    """The usage functions of migration `quotas`, with what a row counts as (`rows`) and its
    stored bytes (`stored`) as parameters."""
    return f"""
CREATE OR REPLACE FUNCTION memgate_stored_bytes(m memories) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$ SELECT {stored} $$;
CREATE OR REPLACE FUNCTION memgate_count_usage() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    d_rows bigint := 0;
    d_bytes bigint := 0;
    t uuid;
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        d_rows := d_rows - {rows.format(row="OLD")};
        d_bytes := d_bytes - memgate_stored_bytes(OLD);
        t := OLD.tenant_id;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        d_rows := d_rows + {rows.format(row="NEW")};
        d_bytes := d_bytes + memgate_stored_bytes(NEW);
        t := NEW.tenant_id;
    END IF;
    IF d_rows <> 0 OR d_bytes <> 0 THEN
        INSERT INTO tenant_usage AS u (tenant_id, stripe, stored_count, stored_bytes)
        VALUES (t, pg_backend_pid() % {STRIPES}, d_rows, d_bytes)
        ON CONFLICT (tenant_id, stripe) DO UPDATE
           SET stored_count = u.stored_count + EXCLUDED.stored_count,
               stored_bytes = u.stored_bytes + EXCLUDED.stored_bytes;
    END IF;
    RETURN NULL;
END
$$;
"""


BYTES = (
    "octet_length(m.subject) + octet_length(m.key) + octet_length(m.value) "
    "+ coalesce(octet_length(m.source), 0) + octet_length(m.metadata::text)"
)


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute("ALTER TABLE memories ADD COLUMN retracted_at timestamptz")
    op.execute("ALTER TABLE memories ALTER COLUMN embedding DROP NOT NULL")
    op.execute(
        f"CREATE POLICY memories_retract ON memories FOR UPDATE TO {APP_ROLE} "
        f"USING ({DELETER}) WITH CHECK ({DELETER} AND {STUB})"
    )
    # No stub exists yet, so the counters stay right as they are.
    op.execute(
        _counter(
            f"CASE WHEN m.retracted_at IS NULL THEN {BYTES} ELSE 0 END",
            "CASE WHEN {row}.retracted_at IS NULL THEN 1 ELSE 0 END",
        )
    )


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    # As the owner, bound by FORCE ROW LEVEL SECURITY: lifted for this transaction only.
    op.execute("ALTER TABLE memories NO FORCE ROW LEVEL SECURITY")
    op.execute(
        "UPDATE memories m SET supersedes = NULL WHERE m.supersedes IN "
        "(SELECT s.id FROM memories s WHERE s.tenant_id = m.tenant_id "
        "AND s.retracted_at IS NOT NULL)"
    )
    op.execute(
        "UPDATE memories m SET superseded_by = NULL WHERE m.superseded_by IN "
        "(SELECT s.id FROM memories s WHERE s.tenant_id = m.tenant_id "
        "AND s.retracted_at IS NOT NULL)"
    )
    # Stubs count for nothing, so removing them leaves the counters right.
    op.execute("DELETE FROM memories WHERE retracted_at IS NOT NULL")
    op.execute("ALTER TABLE memories FORCE ROW LEVEL SECURITY")
    op.execute(_counter(BYTES, "1"))
    op.execute("DROP POLICY memories_retract ON memories")
    op.execute("ALTER TABLE memories ALTER COLUMN embedding SET NOT NULL")
    op.execute("ALTER TABLE memories DROP COLUMN retracted_at")
