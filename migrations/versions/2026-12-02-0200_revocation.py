"""Revocation that holds (issue 15, promise 7): revoke and reinstate a memory.

- `revocations`: one row per revocation of a memory: the memory, its space and its content
  hash (what a re-written claim is looked up by while the revocation stands), the reason
  (content-like: kept here, never in audit rows), who revoked it and when; reinstating fills
  `reinstated_*`. At most one standing revocation per memory (`uq_revocations_standing`);
  `ix_revocations_content` is the write path's lookup.
- `memory_hidings`: why a row is hidden: one row per (memory, standing revocation) that hides
  it (the revoked memory, its content-equal copies in the space, and everything whose
  `derived_from` reaches one of those). A row is hidden while it has one; `memories.revoked_at`
  is set exactly then, so Visible, the live-row indexes (the HNSW one included) and every
  read keep the one clause `revoked_at IS NULL`: hidden rows never take a candidate slot.
- `ix_memories_derived_from`: GIN on `derived_from`, for the walk to derived rows.
- `memgate_revocation_hide(revocation)` / `memgate_revocation_lift(revocation)`: the tenant-wide
  materialisation, SECURITY DEFINER (owner). Hiding must reach rows the revoker cannot read (a
  summary whose audience is wider or narrower than the revoker's), which row-level security
  rightly forbids the app role; the functions take the tenant from the transaction
  (`memgate_tenant()`) and act only on the revocation named, which the service wrote in the
  same transaction after checking the caller's delete grant. `memories_revocation` is the
  owner's policy on `memories` (FORCE ROW LEVEL SECURITY binds the owner too), limited to
  the transaction's tenant, and `memgate_retract_only` lets the table owner through (it owns
  the table; only these functions run as it at request time).
- Lifting: a row comes back only when its last cause goes. A row that comes back while its key
  has a live version (a copy stored hidden, or a version re-written while it was hidden) is
  closed by that live version (the live one stays live); of several coming back for one key,
  the newest stays live.

Revision ID: 20261202_revocation
Revises: 20261202_idempotency_keys
Create Date: 2026-12-02 02:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "20261202_revocation"
down_revision: str | Sequence[str] | None = "20261202_idempotency_keys"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

APP_ROLE = "memgate_app"
TENANT = "tenant_id = (SELECT memgate_tenant())"

SCHEMA = f"""
CREATE TABLE revocations (
    tenant_id uuid NOT NULL,
    id uuid NOT NULL,
    memory_id uuid NOT NULL,
    space_id uuid NOT NULL,
    content_hash bytea NOT NULL,
    reason text NOT NULL,
    revoked_by uuid NOT NULL,
    revoked_at timestamptz NOT NULL DEFAULT now(),
    reinstated_by uuid,
    reinstated_at timestamptz,
    reinstate_reason text,
    CONSTRAINT pk_revocations PRIMARY KEY (tenant_id, id),
    CONSTRAINT fk_revocations_tenant_id_tenants FOREIGN KEY (tenant_id)
        REFERENCES tenants (tenant_id) ON DELETE CASCADE
);
CREATE UNIQUE INDEX uq_revocations_standing ON revocations (tenant_id, memory_id)
    WHERE reinstated_at IS NULL;
CREATE INDEX ix_revocations_content ON revocations (tenant_id, space_id, content_hash)
    WHERE reinstated_at IS NULL;
ALTER TABLE revocations ENABLE ROW LEVEL SECURITY;
CREATE POLICY revocations_tenant ON revocations TO {APP_ROLE}
    USING ({TENANT}) WITH CHECK ({TENANT});
GRANT SELECT, INSERT, UPDATE ON revocations TO {APP_ROLE};

CREATE TABLE memory_hidings (
    tenant_id uuid NOT NULL,
    memory_id uuid NOT NULL,
    revocation_id uuid NOT NULL,
    CONSTRAINT pk_memory_hidings PRIMARY KEY (tenant_id, memory_id, revocation_id),
    CONSTRAINT fk_memory_hidings_tenant_id_tenants FOREIGN KEY (tenant_id)
        REFERENCES tenants (tenant_id) ON DELETE CASCADE
);
CREATE INDEX ix_memory_hidings_revocation ON memory_hidings (tenant_id, revocation_id);
ALTER TABLE memory_hidings ENABLE ROW LEVEL SECURITY;
CREATE POLICY memory_hidings_tenant ON memory_hidings TO {APP_ROLE}
    USING ({TENANT}) WITH CHECK ({TENANT});
-- The app role inserts the causes of a row it writes hidden; hiding and lifting others is
-- the functions' work.
GRANT SELECT, INSERT ON memory_hidings TO {APP_ROLE};

CREATE INDEX ix_memories_derived_from ON memories USING gin (derived_from);

CREATE POLICY memories_revocation ON memories TO CURRENT_USER
    USING ({TENANT}) WITH CHECK ({TENANT});
"""

FUNCTIONS = f"""
CREATE FUNCTION memgate_revocation_hide(p_revocation uuid) RETURNS SETOF uuid
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    r revocations;
BEGIN
    SELECT * INTO r FROM revocations
     WHERE tenant_id = memgate_tenant() AND id = p_revocation AND reinstated_at IS NULL;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no standing revocation % in this tenant', p_revocation
            USING ERRCODE = 'no_data_found';
    END IF;
    CREATE TEMP TABLE IF NOT EXISTS memgate_reached (id uuid PRIMARY KEY) ON COMMIT DROP;
    TRUNCATE memgate_reached;
    INSERT INTO memgate_reached
    WITH RECURSIVE reached(id) AS (
        SELECT m.id FROM memories m
         WHERE m.tenant_id = r.tenant_id
           AND (m.id = r.memory_id
                OR (m.space_id = r.space_id AND m.content_hash = r.content_hash))
        UNION
        SELECT m.id FROM memories m JOIN reached ON m.derived_from @> ARRAY[reached.id]
         WHERE m.tenant_id = r.tenant_id
    )
    SELECT id FROM reached;
    INSERT INTO memory_hidings (tenant_id, memory_id, revocation_id)
        SELECT r.tenant_id, id, r.id FROM memgate_reached
        ON CONFLICT DO NOTHING;
    UPDATE memories m SET revoked_at = now()
      FROM memgate_reached x
     WHERE m.tenant_id = r.tenant_id AND m.id = x.id AND m.revoked_at IS NULL;
    RETURN QUERY SELECT id FROM memgate_reached;
END
$$;

CREATE FUNCTION memgate_revocation_lift(p_revocation uuid) RETURNS SETOF uuid
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
    SELECT coalesce(array_agg(g.memory_id), '{{}}') INTO freed FROM gone g
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
REVOKE ALL ON FUNCTION memgate_revocation_hide(uuid), memgate_revocation_lift(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION memgate_revocation_hide(uuid), memgate_revocation_lift(uuid)
    TO {APP_ROLE};
"""

OWNER_PASSES = """
CREATE OR REPLACE FUNCTION memgate_retract_only() RETURNS trigger
LANGUAGE plpgsql SET search_path = public, pg_temp AS $$
DECLARE
    writable uuid[];
    readable uuid[];
BEGIN
    IF NOT row_security_active('public.memories'::regclass)%(owner)s THEN
        RETURN NEW;
    END IF;
    SELECT memgate_granted('write'), memgate_granted('read') INTO writable, readable;
    IF (OLD.tenant_id = memgate_tenant() AND NEW.tenant_id = OLD.tenant_id
        AND OLD.space_id = ANY (writable) AND OLD.space_id = ANY (readable)
        AND OLD.read_requires <@ readable
        AND NEW.space_id = ANY (writable) AND NEW.space_id = ANY (readable)
        AND NEW.read_requires <@ readable) IS TRUE
       OR memgate_is_retraction(OLD, NEW) IS TRUE THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'without write on memory %%, an update may only retract it', OLD.id
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'delete retracts a version into a closed, content-free stub; '
                     'nothing else changes';
END
$$;
"""
# The table owner (the revocation functions, SECURITY DEFINER) is not held to retraction.
OWNER_TEST = (
    "\n       OR (SELECT c.relowner FROM pg_class c WHERE c.oid = 'public.memories'::regclass)"
    "\n          = (SELECT r.oid FROM pg_roles r WHERE r.rolname = current_user)"
)


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(SCHEMA)
    op.execute(FUNCTIONS)
    op.execute(OWNER_PASSES % {"owner": OWNER_TEST})


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(OWNER_PASSES % {"owner": ""})
    op.execute("DROP FUNCTION memgate_revocation_lift(uuid)")
    op.execute("DROP FUNCTION memgate_revocation_hide(uuid)")
    op.execute("DROP POLICY memories_revocation ON memories")
    op.execute("DROP INDEX ix_memories_derived_from")
    op.execute("DROP TABLE memory_hidings")
    op.execute("DROP TABLE revocations")
