"""Audit log: hash-chained, append-only, per tenant; and the non-owner role the app runs as.

- `memgate_app` (NOLOGIN) is the role every app connection switches to. It owns nothing: it may
  read and write the data tables, read the audit tables, and append to the audit log only by
  calling `audit_append()` (SECURITY DEFINER, owned by the migration role). It has no UPDATE,
  DELETE or TRUNCATE on `audit_events`, `audit_heads` or `audit_checkpoints`.
- `audit_append()` takes a per-tenant advisory lock, numbers the row, and computes
  `row_hash = sha256(prev_hash || utf8(audit_canonical(row)))` inside the database, so the app
  cannot choose a hash. `audit_canonical()` is a fixed, length-prefixed text layout documented in
  docs/audit.md; the independent verifier re-implements it from that description.
- Triggers enabled ALWAYS reject UPDATE, DELETE and TRUNCATE (also under
  `session_replication_role = replica`). They stop mistakes, not a superuser: the hash chain and
  the signed checkpoints are what make tampering evident.
- Monthly range partitions on `at`, created ahead by `audit_ensure_partitions()` and, as a
  fallback, by the append function itself.

The role is cluster-wide, so downgrade revokes its grants and leaves it in place.

Revision ID: 20261130_audit
Revises: 20261130_core
Create Date: 2026-11-30 14:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "20261130_audit"
down_revision: str | Sequence[str] | None = "20261130_core"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

APP_ROLE = "memgate_app"
DATA_TABLES = ("tenants", "principals", "clients", "signing_keys", "spaces", "memories")

TABLES = """
CREATE TABLE role_assignments (
    tenant_id uuid NOT NULL,
    principal_id uuid NOT NULL,
    role text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT pk_role_assignments PRIMARY KEY (tenant_id, principal_id, role),
    CONSTRAINT fk_role_assignments_tenant_id_principal_id_principals
        FOREIGN KEY (tenant_id, principal_id) REFERENCES principals (tenant_id, id)
        ON DELETE CASCADE,
    CONSTRAINT ck_role_assignments_role CHECK (role IN ('auditor'))
);

CREATE TABLE audit_events (
    tenant_id uuid NOT NULL,
    seq bigint NOT NULL,
    at timestamptz NOT NULL,
    request_id text NOT NULL,
    trace_id text,
    actor text,
    client_id text,
    delegation text[] NOT NULL,
    token_id text,
    issuer text,
    scopes text[] NOT NULL,
    method text NOT NULL,
    route text NOT NULL,
    action text NOT NULL,
    target_ids uuid[] NOT NULL,
    result_count integer,
    decision text NOT NULL,
    reason text NOT NULL,
    status integer NOT NULL,
    latency_us bigint NOT NULL,
    policy_version bigint,
    prev_hash bytea NOT NULL,
    row_hash bytea NOT NULL,
    CONSTRAINT pk_audit_events PRIMARY KEY (tenant_id, seq, at),
    -- The canonical layout encodes one-dimensional arrays that start at 1; nothing else may be
    -- stored (a reshaped array would hash alike in SQL and differently in the verifier).
    CONSTRAINT ck_audit_events_flat_arrays CHECK (
        coalesce(array_ndims(delegation), 1) = 1 AND coalesce(array_lower(delegation, 1), 1) = 1
        AND coalesce(array_ndims(scopes), 1) = 1 AND coalesce(array_lower(scopes, 1), 1) = 1
        AND coalesce(array_ndims(target_ids), 1) = 1
        AND coalesce(array_lower(target_ids, 1), 1) = 1
    )
) PARTITION BY RANGE (at);

CREATE TABLE audit_heads (
    tenant_id uuid NOT NULL,
    seq bigint NOT NULL,
    row_hash bytea NOT NULL,
    CONSTRAINT pk_audit_heads PRIMARY KEY (tenant_id)
);

CREATE TABLE audit_checkpoints (
    tenant_id uuid NOT NULL,
    seq bigint NOT NULL,
    row_hash bytea NOT NULL,
    signed_at timestamptz NOT NULL,
    kid text NOT NULL,
    jws text NOT NULL,
    CONSTRAINT pk_audit_checkpoints PRIMARY KEY (tenant_id, seq)
);

CREATE TABLE audit_signing_keys (
    kid text NOT NULL,
    public_jwk jsonb NOT NULL,
    private_key_encrypted bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    retired_at timestamptz,
    CONSTRAINT pk_audit_signing_keys PRIMARY KEY (kid)
);

CREATE TABLE audit_pseudonym_keys (
    tenant_id uuid NOT NULL,
    key_encrypted bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT pk_audit_pseudonym_keys PRIMARY KEY (tenant_id)
);

CREATE TABLE audit_actors (
    tenant_id uuid NOT NULL,
    pseudonym text NOT NULL,
    subject text NOT NULL,
    principal_id uuid,
    first_seen_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT pk_audit_actors PRIMARY KEY (tenant_id, pseudonym)
);
"""

FUNCTIONS = r"""
-- One field of the canonical layout: '-' for NULL, else '<utf8 byte length>:<text>'.
CREATE FUNCTION audit_enc(v text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN v IS NULL THEN '-' ELSE octet_length(v)::text || ':' || v END;

-- An array: '[<count>]' followed by each element encoded as above.
CREATE FUNCTION audit_enc_array(v text[]) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN v IS NULL THEN '-' ELSE
    '[' || cardinality(v)::text || ']' || coalesce(
        (SELECT string_agg(audit_enc(e), '' ORDER BY i) FROM unnest(v) WITH ORDINALITY AS u(e, i)),
        '')
END;

-- The bytes a row's hash covers (with prev_hash in front). Field order is fixed; time is
-- microseconds since the Unix epoch so no time zone or datestyle setting changes the text.
CREATE FUNCTION audit_canonical(e audit_events) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 'memgate.audit.v1'
    || audit_enc(e.tenant_id::text)
    || audit_enc(e.seq::text)
    || audit_enc(((extract(epoch FROM e.at) * 1000000)::bigint)::text)
    || audit_enc(e.request_id)
    || audit_enc(e.trace_id)
    || audit_enc(e.actor)
    || audit_enc(e.client_id)
    || audit_enc_array(e.delegation)
    || audit_enc(e.token_id)
    || audit_enc(e.issuer)
    || audit_enc_array(e.scopes)
    || audit_enc(e.method)
    || audit_enc(e.route)
    || audit_enc(e.action)
    || audit_enc_array(e.target_ids::text[])
    || audit_enc(e.result_count::text)
    || audit_enc(e.decision)
    || audit_enc(e.reason)
    || audit_enc(e.status::text)
    || audit_enc(e.latency_us::text)
    || audit_enc(e.policy_version::text);

CREATE FUNCTION audit_reject_mutation() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit tables are append-only (% on %)', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege';
END $$;

-- The partition holding `month` (any instant in it); created if missing, with its own TRUNCATE
-- guard (a statement trigger on the parent does not fire for TRUNCATE of a partition).
CREATE FUNCTION audit_ensure_partition(month timestamptz) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    lower_bound timestamptz := date_trunc('month', month AT TIME ZONE 'UTC') AT TIME ZONE 'UTC';
    upper_bound timestamptz := lower_bound + interval '1 month';
    name text := 'audit_events_' || to_char(lower_bound AT TIME ZONE 'UTC', 'YYYY_MM');
BEGIN
    -- Schema-qualified: a temporary table of that name must not pass for the partition.
    IF to_regclass('public.' || name) IS NOT NULL THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended('memgate.audit.partition', 0));
    IF to_regclass('public.' || name) IS NOT NULL THEN
        RETURN;
    END IF;
    EXECUTE format('CREATE TABLE public.%I PARTITION OF public.audit_events '
                   'FOR VALUES FROM (%L) TO (%L)', name, lower_bound, upper_bound);
    EXECUTE format('CREATE TRIGGER audit_no_truncate BEFORE TRUNCATE ON public.%I '
                   'FOR EACH STATEMENT EXECUTE FUNCTION public.audit_reject_mutation()', name);
    EXECUTE format('ALTER TABLE public.%I ENABLE ALWAYS TRIGGER audit_no_truncate', name);
    EXECUTE format('ALTER TABLE public.%I ENABLE ALWAYS TRIGGER audit_no_mutation', name);
END $$;

-- This month and the next `ahead` months (the checkpoint job calls it so the append path
-- rarely has to create a partition itself).
CREATE FUNCTION audit_ensure_partitions(ahead integer DEFAULT 2) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    IF ahead NOT BETWEEN 0 AND 12 THEN
        RAISE EXCEPTION 'audit partitions are made at most 12 months ahead';
    END IF;
    FOR i IN 0..ahead LOOP
        PERFORM audit_ensure_partition(now() + make_interval(months => i));
    END LOOP;
END $$;

CREATE FUNCTION audit_append(
    p_tenant_id uuid,
    p_request_id text,
    p_trace_id text,
    p_actor text,
    p_client_id text,
    p_delegation text[],
    p_token_id text,
    p_issuer text,
    p_scopes text[],
    p_method text,
    p_route text,
    p_action text,
    p_target_ids uuid[],
    p_result_count integer,
    p_decision text,
    p_reason text,
    p_status integer,
    p_latency_us bigint
) RETURNS TABLE (appended_seq bigint, appended_hash bytea)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    e audit_events;
    head_seq bigint;
    head_hash bytea;
BEGIN
    IF p_decision NOT IN ('allow', 'deny', 'error') THEN
        RAISE EXCEPTION 'audit decision must be allow, deny or error';
    END IF;
    -- Serialises this tenant's appends only; held until the caller's transaction ends.
    PERFORM pg_advisory_xact_lock(hashtextextended('memgate.audit:' || p_tenant_id::text, 0));
    SELECT h.seq, h.row_hash INTO head_seq, head_hash
      FROM audit_heads h WHERE h.tenant_id = p_tenant_id;
    e.tenant_id := p_tenant_id;
    e.seq := coalesce(head_seq, 0) + 1;
    e.at := clock_timestamp();
    e.request_id := p_request_id;
    e.trace_id := p_trace_id;
    e.actor := p_actor;
    e.client_id := p_client_id;
    e.delegation := coalesce(p_delegation, '{}');
    e.token_id := p_token_id;
    e.issuer := p_issuer;
    e.scopes := coalesce(p_scopes, '{}');
    e.method := p_method;
    e.route := p_route;
    e.action := p_action;
    e.target_ids := coalesce(p_target_ids, '{}');
    e.result_count := p_result_count;
    e.decision := p_decision;
    e.reason := p_reason;
    e.status := p_status;
    e.latency_us := p_latency_us;
    e.policy_version := (SELECT t.policy_version FROM tenants t WHERE t.tenant_id = p_tenant_id);
    e.prev_hash := coalesce(head_hash, '\x0000000000000000000000000000000000000000000000000000000000000000'::bytea);
    e.row_hash := sha256(e.prev_hash || convert_to(audit_canonical(e), 'UTF8'));
    PERFORM audit_ensure_partition(e.at);
    INSERT INTO audit_events SELECT e.*;
    INSERT INTO audit_heads AS h (tenant_id, seq, row_hash)
        VALUES (e.tenant_id, e.seq, e.row_hash)
        ON CONFLICT (tenant_id) DO UPDATE SET seq = excluded.seq, row_hash = excluded.row_hash;
    RETURN QUERY SELECT e.seq, e.row_hash;
END $$;
"""

GUARDS = """
CREATE TRIGGER audit_no_mutation BEFORE UPDATE OR DELETE ON audit_events
    FOR EACH ROW EXECUTE FUNCTION audit_reject_mutation();
CREATE TRIGGER audit_no_truncate BEFORE TRUNCATE ON audit_events
    FOR EACH STATEMENT EXECUTE FUNCTION audit_reject_mutation();
ALTER TABLE audit_events ENABLE ALWAYS TRIGGER audit_no_mutation;
ALTER TABLE audit_events ENABLE ALWAYS TRIGGER audit_no_truncate;
CREATE TRIGGER audit_no_mutation BEFORE UPDATE OR DELETE ON audit_checkpoints
    FOR EACH ROW EXECUTE FUNCTION audit_reject_mutation();
CREATE TRIGGER audit_no_truncate BEFORE TRUNCATE ON audit_checkpoints
    FOR EACH STATEMENT EXECUTE FUNCTION audit_reject_mutation();
ALTER TABLE audit_checkpoints ENABLE ALWAYS TRIGGER audit_no_mutation;
ALTER TABLE audit_checkpoints ENABLE ALWAYS TRIGGER audit_no_truncate;
SELECT audit_ensure_partitions(2);
"""


def _grants() -> str:
    data = ", ".join((*DATA_TABLES, "role_assignments"))
    return f"""
DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{APP_ROLE}') THEN
        CREATE ROLE {APP_ROLE} NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS;
    END IF;
END $$;
GRANT USAGE ON SCHEMA public TO {APP_ROLE};
GRANT SELECT ON alembic_version TO {APP_ROLE};
GRANT SELECT, INSERT, UPDATE, DELETE ON {data} TO {APP_ROLE};
GRANT SELECT, INSERT ON audit_pseudonym_keys, audit_checkpoints, audit_signing_keys
    TO {APP_ROLE};
-- The actor map may gain rows and lose them (erasure); re-pointing a pseudonym is refused.
GRANT SELECT, INSERT, DELETE ON audit_actors TO {APP_ROLE};
GRANT SELECT ON audit_events, audit_heads TO {APP_ROLE};
REVOKE ALL ON FUNCTION audit_append(uuid, text, text, text, text, text[], text, text, text[],
    text, text, text, uuid[], integer, text, text, integer, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION audit_ensure_partition(timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION audit_ensure_partitions(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION audit_append(uuid, text, text, text, text, text[], text, text, text[],
    text, text, text, uuid[], integer, text, text, integer, bigint) TO {APP_ROLE};
GRANT EXECUTE ON FUNCTION audit_ensure_partitions(integer) TO {APP_ROLE};
"""


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(TABLES)
    op.execute(FUNCTIONS)
    op.execute(GUARDS)
    op.execute(_grants())


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(
        f"REVOKE ALL ON {', '.join(DATA_TABLES)}, alembic_version FROM {APP_ROLE};"
        f"REVOKE USAGE ON SCHEMA public FROM {APP_ROLE};"
    )
    # Functions that take the row type go first; the trigger function after its triggers.
    op.execute(
        "DROP FUNCTION audit_append, audit_canonical, audit_ensure_partitions, "
        "audit_ensure_partition"
    )
    op.execute(
        "DROP TABLE audit_events, audit_heads, audit_checkpoints, audit_signing_keys, "
        "audit_pseudonym_keys, audit_actors, role_assignments"
    )
    op.execute("DROP FUNCTION audit_reject_mutation, audit_enc_array, audit_enc")
