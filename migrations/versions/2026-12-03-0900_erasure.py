"""Erasure with proof (issue 16, promise 9): plans, tombstones and the tenant-wide functions.

- `erasure_plans`: one row per plan: its criteria (subjects, owner principals, memory ids,
  names for the mention scan), the reason, a fingerprint of what it reaches (execution is
  refused when the data changed since), and once executed the erased ids, the counts per layer,
  the signed receipt and the proof's evidence. Executing replaces the subjects by their audit
  pseudonyms and clears the names: afterwards the row holds ids, counts and digests only.
- `erasure_tombstones`: the content hashes of erased rows by space (unless the plan asked
  otherwise): a write of the same normalized text into that space is refused
  (`content-erased`). By space, not tenant-wide: a writer elsewhere could otherwise test
  guesses of an erased text against the 409 (red team, finding 5).
- `memgate_erasure_reach(plan)`, `memgate_erasure_values(plan)`, `memgate_erasure_nearest(...)`,
  `memgate_erasure_execute(plan)`, `memgate_erasure_left(ids, owners)`: SECURITY DEFINER
  (owner), like revocation's functions: an erasure reaches every space of the tenant, which
  row-level security rightly forbids the app role. Each takes the tenant from the transaction
  (`memgate_tenant()`) and acts only on the plan named, which the service wrote after checking
  the caller's scope and eraser role; `memories_revocation`, the owner's policy on `memories`,
  keeps them inside the transaction's tenant.
- Statistics: `ANALYZE` copies column values into `pg_statistic` (most common values,
  histograms). The content columns keep none (`SET STATISTICS 0`), so an erased text cannot
  linger there until the next ANALYZE.
- `MAINTAIN` (PostgreSQL 17+) on the tables an erasure touches lets the app role VACUUM them
  after the deletion commits; on older servers the operator runs it (docs/erasure.md).

Revision ID: 20261203_erasure
Revises: 20261202_revocation_fixes
Create Date: 2026-12-03 09:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "20261203_erasure"
down_revision: str | Sequence[str] | None = "20261202_revocation_fixes"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

APP_ROLE = "memgate_app"
TENANT = "tenant_id = (SELECT memgate_tenant())"
TOUCHED = (
    "memories",
    "memory_hidings",
    "revocations",
    "memory_recalls",
    "review_rejections",
    "idempotency_keys",
    "audit_actors",
    "erasure_plans",
    # and a tenant's erasure (memgate_erase_tenant):
    "erasure_tombstones",
    "job_runs",
    "audit_pseudonym_keys",
    "principals",
    "clients",
    "spaces",
    "space_grants",
    "casbin_rule",
    "teams",
    "delegations",
    "role_grants",
    "principal_roles",
    "tenant_issuers",
    "tenant_limits",
    "quota_buckets",
    "quota_slots",
    "tenant_usage",
    "tenants",
    "audit_events",
    "audit_heads",
    "audit_checkpoints",
)
"""The tables an erasure deletes from or rewrites (VACUUMed after it: service/erasure/files.py
names the same lists)."""
CONTENT_COLUMNS = ("value", "key", "metadata", "lexical", "source")

SCHEMA = f"""
CREATE TABLE erasure_plans (
    tenant_id uuid NOT NULL,
    id uuid NOT NULL,
    version integer NOT NULL DEFAULT 1,
    state text NOT NULL DEFAULT 'planned',
    subjects text[] NOT NULL DEFAULT '{{}}',
    owners uuid[] NOT NULL DEFAULT '{{}}',
    memory_ids uuid[] NOT NULL DEFAULT '{{}}',
    names text[] NOT NULL DEFAULT '{{}}',
    name_count integer NOT NULL DEFAULT 0,
    keep_tombstones boolean NOT NULL DEFAULT true,
    rewrite boolean NOT NULL DEFAULT true,
    reason text NOT NULL,
    fingerprint bytea NOT NULL,
    erased_tenant uuid,
    planned_by uuid NOT NULL,
    planned_at timestamptz NOT NULL DEFAULT now(),
    executed_by uuid,
    executed_at timestamptz,
    erased uuid[] NOT NULL DEFAULT '{{}}',
    counts jsonb NOT NULL DEFAULT '{{}}'::jsonb,
    receipt text,
    evidence jsonb NOT NULL DEFAULT '{{}}'::jsonb,
    CONSTRAINT pk_erasure_plans PRIMARY KEY (tenant_id, id),
    CONSTRAINT fk_erasure_plans_tenant_id_tenants FOREIGN KEY (tenant_id)
        REFERENCES tenants (tenant_id) ON DELETE CASCADE,
    CONSTRAINT ck_erasure_plans_state CHECK (state IN ('planned', 'executed'))
);
ALTER TABLE erasure_plans ENABLE ROW LEVEL SECURITY;
CREATE POLICY erasure_plans_tenant ON erasure_plans TO {APP_ROLE}
    USING ({TENANT}) WITH CHECK ({TENANT});
GRANT SELECT, INSERT, UPDATE ON erasure_plans TO {APP_ROLE};

CREATE TABLE erasure_tombstones (
    tenant_id uuid NOT NULL,
    space_id uuid NOT NULL,
    content_hash bytea NOT NULL,
    erasure_id uuid NOT NULL,
    erased_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT pk_erasure_tombstones PRIMARY KEY (tenant_id, space_id, content_hash),
    CONSTRAINT fk_erasure_tombstones_tenant_id_tenants FOREIGN KEY (tenant_id)
        REFERENCES tenants (tenant_id) ON DELETE CASCADE
);
ALTER TABLE erasure_tombstones ENABLE ROW LEVEL SECURITY;
CREATE POLICY erasure_tombstones_tenant ON erasure_tombstones TO {APP_ROLE}
    USING ({TENANT}) WITH CHECK ({TENANT});
-- The write path reads them; only the execute function adds them.
GRANT SELECT ON erasure_tombstones TO {APP_ROLE};
"""

FUNCTIONS = f"""
CREATE FUNCTION memgate_erasure_reach(p_plan uuid)
RETURNS TABLE (memory_id uuid, space_id uuid, version integer, why text)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    p erasure_plans;
BEGIN
    SELECT * INTO p FROM erasure_plans
     WHERE tenant_id = memgate_tenant() AND id = p_plan AND state = 'planned';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no planned erasure % in this tenant', p_plan
            USING ERRCODE = 'no_data_found';
    END IF;
    RETURN QUERY
    WITH RECURSIVE direct AS (
        SELECT m.id,
               CASE WHEN m.id = ANY (p.memory_ids) THEN 'id'
                    WHEN m.subject = ANY (p.subjects) THEN 'subject'
                    ELSE 'owner' END AS why
          FROM memories m
         WHERE m.tenant_id = p.tenant_id
           AND (m.id = ANY (p.memory_ids) OR m.subject = ANY (p.subjects)
                OR m.owner_id = ANY (p.owners))
    ), chained(id) AS (
        SELECT id FROM direct
        UNION
        SELECT m.id FROM memories m JOIN chained c
            ON m.superseded_by = c.id OR m.supersedes = c.id
         WHERE m.tenant_id = p.tenant_id
    ), derived(id) AS (
        SELECT id FROM chained
        UNION
        SELECT m.id FROM memories m JOIN derived d ON m.derived_from @> ARRAY[d.id]
         WHERE m.tenant_id = p.tenant_id
    ), erased AS (
        SELECT d.id,
               coalesce((SELECT x.why FROM direct x WHERE x.id = d.id),
                        CASE WHEN d.id IN (SELECT c.id FROM chained c) THEN 'version'
                             ELSE 'derived' END) AS why
          FROM derived d
    )
    SELECT m.id, m.space_id, m.version, e.why
      FROM erased e JOIN memories m ON m.tenant_id = p.tenant_id AND m.id = e.id
    UNION ALL
    SELECT m.id, m.space_id, m.version, 'mention'
      FROM memories m
     WHERE m.tenant_id = p.tenant_id AND cardinality(p.names) > 0
       AND m.retracted_at IS NULL
       AND m.id NOT IN (SELECT e.id FROM erased e)
       AND EXISTS (SELECT 1 FROM unnest(p.names) n
                    WHERE strpos(lower(m.value), lower(n)) > 0);
END
$$;

-- The erased rows' text and vectors: needles for the proof's byte scan and nearest-vector
-- check, held in the process for the length of the execution and never stored.
CREATE FUNCTION memgate_erasure_values(p_plan uuid)
RETURNS TABLE (memory_id uuid, value text, embedding text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT m.id, m.value, m.embedding::text
      FROM memories m
     WHERE m.tenant_id = memgate_tenant()
       AND m.id IN (SELECT r.memory_id FROM memgate_erasure_reach(p_plan) r
                     WHERE r.why <> 'mention')
$$;

-- For each vector, the most similar row of the tenant outside `p_exclude` (cosine).
CREATE FUNCTION memgate_erasure_nearest(p_exclude uuid[], p_vectors text[])
RETURNS TABLE (ord integer, memory_id uuid, similarity double precision)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT v.ord::integer, n.id, 1 - n.distance
      FROM unnest(p_vectors) WITH ORDINALITY AS v(vec, ord)
      CROSS JOIN LATERAL (
          SELECT m.id, m.embedding <=> v.vec::vector AS distance
            FROM memories m
           WHERE m.tenant_id = memgate_tenant() AND m.embedding IS NOT NULL
             AND m.id <> ALL (p_exclude)
           ORDER BY 2 LIMIT 1
      ) n
$$;

CREATE FUNCTION memgate_erasure_execute(p_plan uuid)
RETURNS TABLE (layer text, erased bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    p erasure_plans;
    ids uuid[];
    n bigint;
BEGIN
    SELECT * INTO p FROM erasure_plans
     WHERE tenant_id = memgate_tenant() AND id = p_plan AND state = 'planned';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no planned erasure % in this tenant', p_plan
            USING ERRCODE = 'no_data_found';
    END IF;
    SELECT coalesce(array_agg(r.memory_id), '{{}}') INTO ids
      FROM memgate_erasure_reach(p_plan) r WHERE r.why <> 'mention';

    IF p.keep_tombstones THEN
        INSERT INTO erasure_tombstones (tenant_id, space_id, content_hash, erasure_id)
            SELECT DISTINCT m.tenant_id, m.space_id, m.content_hash, p.id FROM memories m
             WHERE m.tenant_id = p.tenant_id AND m.id = ANY (ids) AND m.retracted_at IS NULL
            ON CONFLICT DO NOTHING;
        GET DIAGNOSTICS n = ROW_COUNT;
        layer := 'tombstones'; erased := n; RETURN NEXT;
    END IF;

    DELETE FROM idempotency_keys k WHERE k.tenant_id = p.tenant_id AND k.memory_ids && ids;
    GET DIAGNOSTICS n = ROW_COUNT;
    layer := 'stored_answers'; erased := n; RETURN NEXT;

    DELETE FROM memory_recalls r WHERE r.tenant_id = p.tenant_id AND r.memory_id = ANY (ids);
    GET DIAGNOSTICS n = ROW_COUNT;
    layer := 'recalls'; erased := n; RETURN NEXT;

    DELETE FROM review_rejections r WHERE r.tenant_id = p.tenant_id AND r.memory_id = ANY (ids);
    GET DIAGNOSTICS n = ROW_COUNT;
    layer := 'review_rejections'; erased := n; RETURN NEXT;

    DELETE FROM memory_hidings h WHERE h.tenant_id = p.tenant_id AND h.memory_id = ANY (ids);
    GET DIAGNOSTICS n = ROW_COUNT;
    layer := 'hidings'; erased := n; RETURN NEXT;

    -- A revocation of an erased memory keeps hiding what it hid (its copies and derived rows
    -- outside the erasure stay out of reach: nobody can reinstate a memory that is gone); its
    -- reason, which may speak of the person, goes.
    UPDATE revocations r SET reason = 'erased', reinstate_reason = NULL
     WHERE r.tenant_id = p.tenant_id AND r.memory_id = ANY (ids);
    GET DIAGNOSTICS n = ROW_COUNT;
    layer := 'revocations'; erased := n; RETURN NEXT;

    DELETE FROM audit_actors a
     WHERE a.tenant_id = p.tenant_id
       AND (a.principal_id = ANY (p.owners)
            OR a.subject IN (SELECT k || ':' || o::text
                               FROM unnest(p.owners) o,
                                    unnest(ARRAY['user', 'agent', 'service']) k));
    GET DIAGNOSTICS n = ROW_COUNT;
    layer := 'pseudonym_mappings'; erased := n; RETURN NEXT;

    SELECT count(*) INTO n FROM memories m
     WHERE m.tenant_id = p.tenant_id AND m.id = ANY (ids) AND m.embedding IS NOT NULL;
    layer := 'vectors'; erased := n; RETURN NEXT;

    DELETE FROM memories m WHERE m.tenant_id = p.tenant_id AND m.id = ANY (ids);
    GET DIAGNOSTICS n = ROW_COUNT;
    layer := 'memories'; erased := n; RETURN NEXT;
END
$$;

CREATE FUNCTION memgate_erasure_left(p_ids uuid[], p_owners uuid[])
RETURNS TABLE (rows_left bigint, owned_left bigint, vectors_left bigint, dangling bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT (SELECT count(*) FROM memories m
             WHERE m.tenant_id = memgate_tenant() AND m.id = ANY (p_ids)),
           (SELECT count(*) FROM memories m
             WHERE m.tenant_id = memgate_tenant() AND m.owner_id = ANY (p_owners)),
           (SELECT count(*) FROM memories m
             WHERE m.tenant_id = memgate_tenant() AND m.id = ANY (p_ids)
               AND m.embedding IS NOT NULL),
           (SELECT count(*) FROM memories m
             WHERE m.tenant_id = memgate_tenant() AND m.derived_from && p_ids)
$$;

REVOKE ALL ON FUNCTION memgate_erasure_reach(uuid), memgate_erasure_values(uuid),
    memgate_erasure_nearest(uuid[], text[]), memgate_erasure_execute(uuid),
    memgate_erasure_left(uuid[], uuid[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION memgate_erasure_reach(uuid), memgate_erasure_values(uuid),
    memgate_erasure_nearest(uuid[], text[]), memgate_erasure_execute(uuid),
    memgate_erasure_left(uuid[], uuid[]) TO {APP_ROLE};
"""

# Deleting a tenant is an erasure of the whole tenant (issue 16): every table that holds its
# rows, named one by one (a table added later must be added here: the lifecycle test checks no
# tenant table keeps a retired tenant's rows). The owner's policy on `memories` binds the table
# owner to the tenant the transaction names, so the function names the erased tenant while it
# deletes and the platform tenant again after. `p_drop_audit`: the tenant's audit chain goes
# too (rows, head, checkpoints); by default it stays, content-free, its pseudonyms unresolvable
# once the actor map and the pseudonym key are gone.
TENANT_TABLES = (
    "memory_hidings",
    "revocations",
    "memory_recalls",
    "review_rejections",
    "idempotency_keys",
    "job_runs",
    "erasure_plans",
    "erasure_tombstones",
)
TENANT_ERASURE = f"""
CREATE FUNCTION memgate_tenant_needles(p_tenant uuid, p_limit integer)
RETURNS TABLE (value text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    platform text := current_setting('memgate.tenant_id', true);
BEGIN
    IF NOT memgate_named_platform() THEN
        RAISE EXCEPTION 'only the platform tenant erases a tenant'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    PERFORM set_config('memgate.tenant_id', p_tenant::text, true);
    RETURN QUERY SELECT m.value FROM memories m
     WHERE m.tenant_id = p_tenant AND m.value <> '' ORDER BY m.id LIMIT p_limit;
    PERFORM set_config('memgate.tenant_id', platform, true);
END $$;

CREATE FUNCTION memgate_erase_tenant(p_tenant uuid, p_drop_audit boolean)
RETURNS TABLE (layer text, erased bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    platform text := current_setting('memgate.tenant_id', true);
    n bigint;
    t text;
BEGIN
    IF NOT memgate_named_platform() THEN
        RAISE EXCEPTION 'only the platform tenant erases a tenant'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    PERFORM set_config('memgate.tenant_id', p_tenant::text, true);
    DELETE FROM memories m WHERE m.tenant_id = p_tenant;
    GET DIAGNOSTICS n = ROW_COUNT;
    layer := 'memories'; erased := n; RETURN NEXT;
    FOREACH t IN ARRAY ARRAY['{"', '".join(TENANT_TABLES)}'] LOOP
        EXECUTE format('DELETE FROM %I WHERE tenant_id = $1', t) USING p_tenant;
        GET DIAGNOSTICS n = ROW_COUNT;
        layer := t; erased := n; RETURN NEXT;
    END LOOP;
    DELETE FROM audit_actors a WHERE a.tenant_id = p_tenant;
    GET DIAGNOSTICS n = ROW_COUNT;
    layer := 'pseudonym_mappings'; erased := n; RETURN NEXT;
    DELETE FROM audit_pseudonym_keys k WHERE k.tenant_id = p_tenant;
    GET DIAGNOSTICS n = ROW_COUNT;
    layer := 'pseudonym_keys'; erased := n; RETURN NEXT;
    PERFORM set_config('memgate.tenant_id', platform, true);
    -- principals, clients, spaces, policy, teams, delegations, issuers, quotas, recalls (as
    -- the platform, which it checks; it refuses a tenant still enabled, or the platform).
    SELECT memgate_retire_tenant(p_tenant) INTO n;
    layer := 'identity_policy_quotas'; erased := n; RETURN NEXT;
    IF p_drop_audit THEN
        PERFORM set_config('memgate.audit_drop_tenant', p_tenant::text, true);
        DELETE FROM audit_checkpoints c WHERE c.tenant_id = p_tenant;
        DELETE FROM audit_events e WHERE e.tenant_id = p_tenant;
        GET DIAGNOSTICS n = ROW_COUNT;
        layer := 'audit_rows'; erased := n; RETURN NEXT;
        DELETE FROM audit_heads h WHERE h.tenant_id = p_tenant;
        PERFORM set_config('memgate.audit_drop_tenant', '', true);
    END IF;
END $$;

-- What a tenant's erasure left: rows per table holding its id (the retired `tenants` row and,
-- unless dropped, its audit chain are expected).
CREATE FUNCTION memgate_tenant_left(p_tenant uuid)
RETURNS TABLE (table_name text, rows_left bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    platform text := current_setting('memgate.tenant_id', true);
    t text;
    n bigint;
BEGIN
    IF NOT memgate_named_platform() THEN
        RAISE EXCEPTION 'only the platform tenant proves a tenant erasure'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    PERFORM set_config('memgate.tenant_id', p_tenant::text, true);
    FOR t IN SELECT c.relname FROM pg_class c
               JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'tenant_id'
               JOIN pg_namespace s ON s.oid = c.relnamespace AND s.nspname = 'public'
              WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition
                AND c.relname NOT IN ('tenants', 'erasure_plans')
              ORDER BY 1 LOOP
        EXECUTE format('SELECT count(*) FROM %I WHERE tenant_id = $1', t) INTO n USING p_tenant;
        IF n > 0 THEN
            table_name := t; rows_left := n; RETURN NEXT;
        END IF;
    END LOOP;
    PERFORM set_config('memgate.tenant_id', platform, true);
END $$;
REVOKE ALL ON FUNCTION memgate_tenant_needles(uuid, integer),
    memgate_erase_tenant(uuid, boolean), memgate_tenant_left(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION memgate_tenant_needles(uuid, integer),
    memgate_erase_tenant(uuid, boolean), memgate_tenant_left(uuid) TO {APP_ROLE};

-- Audit rows stay append-only, with one way out: the table owner (the function above, nothing
-- at request time otherwise) deleting the chain of a retired tenant it named for that purpose.
CREATE OR REPLACE FUNCTION audit_reject_mutation() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND TG_LEVEL = 'ROW'
       AND OLD.tenant_id::text = current_setting('memgate.audit_drop_tenant', true)
       AND (SELECT c.relowner FROM pg_class c WHERE c.oid = TG_RELID)
           = (SELECT r.oid FROM pg_roles r WHERE r.rolname = current_user)
       AND EXISTS (SELECT 1 FROM tenants t
                    WHERE t.tenant_id = OLD.tenant_id AND t.retired_at IS NOT NULL) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'audit tables are append-only (% on %)', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege';
END $$;
"""
REJECT_MUTATION = """
CREATE OR REPLACE FUNCTION audit_reject_mutation() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit tables are append-only (% on %)', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege';
END $$;
"""

MAINTAIN = f"""
DO $$
BEGIN
    IF current_setting('server_version_num')::integer >= 170000 THEN
        EXECUTE '%(verb)s MAINTAIN ON {", ".join(TOUCHED)} %(direction)s {APP_ROLE}';
    END IF;
END
$$;
"""


def _statistics(target: int) -> str:
    return "; ".join(
        f"ALTER TABLE memories ALTER COLUMN {column} SET STATISTICS {target}"
        for column in CONTENT_COLUMNS
    )


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(SCHEMA)
    op.execute(FUNCTIONS)
    op.execute(TENANT_ERASURE)
    op.execute(MAINTAIN % {"verb": "GRANT", "direction": "TO"})
    op.execute(_statistics(0))


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(_statistics(-1))
    op.execute(MAINTAIN % {"verb": "REVOKE", "direction": "FROM"})
    op.execute(REJECT_MUTATION)
    op.execute(
        "DROP FUNCTION memgate_tenant_left(uuid), memgate_erase_tenant(uuid, boolean), "
        "memgate_tenant_needles(uuid, integer)"
    )
    op.execute(
        "DROP FUNCTION memgate_erasure_left(uuid[], uuid[]), memgate_erasure_execute(uuid), "
        "memgate_erasure_nearest(uuid[], text[]), memgate_erasure_values(uuid), "
        "memgate_erasure_reach(uuid)"
    )
    op.execute("DROP TABLE erasure_tombstones")
    op.execute("DROP TABLE erasure_plans")
