"""Revocation fixes (issue 15, red team): old rows re-hashed; proposals out of the lift.

- Re-hash: rows written before `20261202_revocation` hold the old `content_hash` (NFKC, case
  fold, white space; invisible code points kept), so a copy spelled with a zero-width space
  did not match its revoked twin and stayed live. Every non-stub row is re-hashed with
  `service.memory.normalize.content_hash`, in batches of `BATCH` keyed by (tenant_id, id), as
  the owner (FORCE ROW LEVEL SECURITY lifted for this transaction only). A stub keeps its empty
  hash. Then every standing revocation is walked again (`memgate_revocation_hide`), so a copy
  that now matches is hidden as if it had been written after the revocation.
  `review_rejections` cannot be re-hashed (it holds no text): a rejection recorded under the
  old hash refuses only the old spelling (docs/revocation.md).
- `memgate_revocation_lift`: proposals (`review_state` not NULL) neither contend for a key's
  live slot nor are closed by it: a reinstated fact is not superseded by a pending proposal
  on its key, and a proposal coming back stays a proposal (uq_memories_live_key already
  leaves proposals out).

Revision ID: 20261202_revocation_fixes
Revises: 20261202_review_state
Create Date: 2026-12-02 05:00:00
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from service.memory.normalize import content_hash

revision: str = "20261202_revocation_fixes"
down_revision: str | Sequence[str] | None = "20261202_review_state"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BATCH = 1000

LIFT = """
CREATE OR REPLACE FUNCTION memgate_revocation_lift(p_revocation uuid) RETURNS SETOF uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    t uuid := memgate_tenant();
    freed uuid[];
BEGIN
    IF NOT EXISTS (SELECT 1 FROM revocations
                    WHERE tenant_id = t AND id = p_revocation AND reinstated_at IS NOT NULL) THEN
        RAISE EXCEPTION 'revocation % is not reinstated in this tenant', p_revocation
            USING ERRCODE = 'no_data_found';
    END IF;
    WITH gone AS (
        DELETE FROM memory_hidings WHERE tenant_id = t AND revocation_id = p_revocation
        RETURNING memory_id
    )
    SELECT coalesce(array_agg(g.memory_id), '{}') INTO freed FROM gone g
     WHERE NOT EXISTS (SELECT 1 FROM memory_hidings h
                        WHERE h.tenant_id = t AND h.memory_id = g.memory_id
                          AND h.revocation_id <> p_revocation);
    -- Rows coming back into a key that has a live version, or several into one key: all but
    -- one are closed first (the live one wins, else the newest), so the live-key index holds.
    WITH back AS (
        SELECT m.* FROM memories m
         WHERE m.tenant_id = t AND m.id = ANY (freed) AND m.superseded_at IS NULL
           AND m.retracted_at IS NULL AND m.review_state IS NULL
    ), contenders AS (
        SELECT b.id, b.space_id, b.subject, b.kind, b.key, b.read_requires, b.recorded_at,
               false AS live
          FROM back b
        UNION ALL
        SELECT m.id, m.space_id, m.subject, m.kind, m.key, m.read_requires, m.recorded_at,
               true AS live
          FROM memories m JOIN (SELECT DISTINCT space_id, subject, kind, key, read_requires
                                  FROM back) k
            ON m.space_id = k.space_id AND m.subject = k.subject AND m.kind = k.kind
           AND m.key = k.key AND m.read_requires = k.read_requires
         WHERE m.tenant_id = t AND m.superseded_at IS NULL AND m.revoked_at IS NULL
           AND m.review_state IS NULL
    ), winners AS (
        SELECT DISTINCT ON (space_id, subject, kind, key, read_requires)
               id, space_id, subject, kind, key, read_requires
          FROM contenders
         ORDER BY space_id, subject, kind, key, read_requires, live DESC, recorded_at DESC,
                  id DESC
    )
    UPDATE memories m
       SET superseded_at = now(), superseded_by = w.id,
           valid_until = greatest(m.valid_from, now())
      FROM back b JOIN winners w
        ON w.space_id = b.space_id AND w.subject = b.subject AND w.kind = b.kind
       AND w.key = b.key AND w.read_requires = b.read_requires
     WHERE m.tenant_id = t AND m.id = b.id AND w.id <> b.id;
    RETURN QUERY
        UPDATE memories m SET revoked_at = NULL
         WHERE m.tenant_id = t AND m.id = ANY (freed) AND m.revoked_at IS NOT NULL
        RETURNING m.id;
END
$$;
"""

LIFT_BEFORE = """
CREATE OR REPLACE FUNCTION memgate_revocation_lift(p_revocation uuid) RETURNS SETOF uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    t uuid := memgate_tenant();
    freed uuid[];
BEGIN
    IF NOT EXISTS (SELECT 1 FROM revocations
                    WHERE tenant_id = t AND id = p_revocation AND reinstated_at IS NOT NULL) THEN
        RAISE EXCEPTION 'revocation % is not reinstated in this tenant', p_revocation
            USING ERRCODE = 'no_data_found';
    END IF;
    WITH gone AS (
        DELETE FROM memory_hidings WHERE tenant_id = t AND revocation_id = p_revocation
        RETURNING memory_id
    )
    SELECT coalesce(array_agg(g.memory_id), '{}') INTO freed FROM gone g
     WHERE NOT EXISTS (SELECT 1 FROM memory_hidings h
                        WHERE h.tenant_id = t AND h.memory_id = g.memory_id
                          AND h.revocation_id <> p_revocation);
    -- Rows coming back into a key that has a live version, or several into one key: all but
    -- one are closed first (the live one wins, else the newest), so the live-key index holds.
    WITH back AS (
        SELECT m.* FROM memories m
         WHERE m.tenant_id = t AND m.id = ANY (freed) AND m.superseded_at IS NULL
           AND m.retracted_at IS NULL
    ), contenders AS (
        SELECT b.id, b.space_id, b.subject, b.kind, b.key, b.read_requires, b.recorded_at,
               false AS live
          FROM back b
        UNION ALL
        SELECT m.id, m.space_id, m.subject, m.kind, m.key, m.read_requires, m.recorded_at,
               true AS live
          FROM memories m JOIN (SELECT DISTINCT space_id, subject, kind, key, read_requires
                                  FROM back) k
            ON m.space_id = k.space_id AND m.subject = k.subject AND m.kind = k.kind
           AND m.key = k.key AND m.read_requires = k.read_requires
         WHERE m.tenant_id = t AND m.superseded_at IS NULL AND m.revoked_at IS NULL
    ), winners AS (
        SELECT DISTINCT ON (space_id, subject, kind, key, read_requires)
               id, space_id, subject, kind, key, read_requires
          FROM contenders
         ORDER BY space_id, subject, kind, key, read_requires, live DESC, recorded_at DESC,
                  id DESC
    )
    UPDATE memories m
       SET superseded_at = now(), superseded_by = w.id,
           valid_until = greatest(m.valid_from, now())
      FROM back b JOIN winners w
        ON w.space_id = b.space_id AND w.subject = b.subject AND w.kind = b.kind
       AND w.key = b.key AND w.read_requires = b.read_requires
     WHERE m.tenant_id = t AND m.id = b.id AND w.id <> b.id;
    RETURN QUERY
        UPDATE memories m SET revoked_at = NULL
         WHERE m.tenant_id = t AND m.id = ANY (freed) AND m.revoked_at IS NOT NULL
        RETURNING m.id;
END
$$;
"""


def _rehash(conn: sa.Connection) -> None:
    after = (uuid.UUID(int=0), uuid.UUID(int=0))
    while True:
        rows = conn.execute(
            sa.text(
                "SELECT tenant_id, id, value, content_hash FROM memories"
                " WHERE retracted_at IS NULL AND (tenant_id, id) > (:tenant, :id)"
                " ORDER BY tenant_id, id LIMIT :batch"
            ),
            {"tenant": after[0], "id": after[1], "batch": BATCH},
        ).all()
        if not rows:
            return
        changed = [
            {"tenant": tenant, "id": id_, "hash": fresh}
            for tenant, id_, value, stored in rows
            if (fresh := content_hash(value)) != bytes(stored)
        ]
        if changed:
            conn.execute(
                sa.text(
                    "UPDATE memories SET content_hash = :hash"
                    " WHERE tenant_id = :tenant AND id = :id"
                ),
                changed,
            )
        after = (rows[-1][0], rows[-1][1])


def _hide_again(conn: sa.Connection) -> None:
    standing = conn.execute(
        sa.text("SELECT tenant_id, id FROM revocations WHERE reinstated_at IS NULL")
    ).all()
    for tenant, revocation in standing:
        # The functions act in the transaction's tenant (memgate_tenant()).
        conn.execute(
            sa.text("SELECT set_config('memgate.tenant_id', :tenant, true)"),
            {"tenant": str(tenant)},
        )
        conn.execute(
            sa.text("SELECT count(*) FROM memgate_revocation_hide(:id)"), {"id": revocation}
        )
    conn.execute(sa.text("SELECT set_config('memgate.tenant_id', '', true)"))


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(LIFT)
    conn = op.get_bind()
    op.execute("ALTER TABLE memories NO FORCE ROW LEVEL SECURITY")
    _rehash(conn)
    op.execute("ALTER TABLE memories FORCE ROW LEVEL SECURITY")
    _hide_again(conn)


def downgrade() -> None:
    # The new hashes stay: they are what the code of every later revision computes.
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(LIFT_BEFORE)
