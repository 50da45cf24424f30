"""Quotas and rate limits per tenant and per client (issue 11).

- `tenant_limits`: the configured limits, one row per (tenant, client scope); `client_id` ''
  is the tenant itself. `limits` is the validated `service.quotas.schemas.Limits` as JSON.
- `quota_buckets`: the shared state of every token bucket (requests, token requests,
  embedding calls): what is left and when it was last refilled. Replicas lease small batches
  from a row in one statement and spend them locally (service/quotas/limiter.py).
- `quota_slots`: concurrent-request slots each replica holds, with an expiry, so the slots
  of a replica that was killed lapse by themselves.
- `tenant_usage`: live memories and their bytes per tenant, kept by a trigger on `memories`
  in the writing transaction, in 16 stripes chosen by the writing backend, so concurrent
  writers of one tenant rarely wait on the same counter row. Existing rows are counted once
  here (as the owner, with row-level security not forced for the length of the statement).

Every table is keyed by `tenant_id` first, goes with its tenant (ON DELETE CASCADE), and has
row-level security keyed on the tenant the transaction names, as the other tenant tables
(migration `app_role_narrowed`).

Revision ID: 20261201_quotas
Revises: 20261201_tenant_issuers
Create Date: 2026-12-01 16:20:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "20261201_quotas"
down_revision: str | Sequence[str] | None = "20261201_tenant_issuers"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

APP_ROLE = "memgate_app"
TENANT = "tenant_id = (SELECT memgate_tenant())"
TABLES = ("tenant_limits", "quota_buckets", "quota_slots", "tenant_usage")
STRIPES = 16

SCHEMA = f"""
CREATE TABLE tenant_limits (
    tenant_id uuid NOT NULL,
    client_id text NOT NULL,
    limits jsonb NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT pk_tenant_limits PRIMARY KEY (tenant_id, client_id),
    CONSTRAINT fk_tenant_limits_tenant_id_tenants FOREIGN KEY (tenant_id)
        REFERENCES tenants (tenant_id) ON DELETE CASCADE
);
CREATE TABLE quota_buckets (
    tenant_id uuid NOT NULL,
    client_id text NOT NULL,
    kind text NOT NULL,
    tokens double precision NOT NULL,
    last_grant integer NOT NULL,
    updated_at timestamptz NOT NULL,
    CONSTRAINT pk_quota_buckets PRIMARY KEY (tenant_id, client_id, kind),
    CONSTRAINT fk_quota_buckets_tenant_id_tenants FOREIGN KEY (tenant_id)
        REFERENCES tenants (tenant_id) ON DELETE CASCADE
);
CREATE TABLE quota_slots (
    tenant_id uuid NOT NULL,
    client_id text NOT NULL,
    replica uuid NOT NULL,
    held integer NOT NULL,
    expires_at timestamptz NOT NULL,
    CONSTRAINT pk_quota_slots PRIMARY KEY (tenant_id, client_id, replica),
    CONSTRAINT fk_quota_slots_tenant_id_tenants FOREIGN KEY (tenant_id)
        REFERENCES tenants (tenant_id) ON DELETE CASCADE
);
CREATE TABLE tenant_usage (
    tenant_id uuid NOT NULL,
    stripe smallint NOT NULL,
    stored_count bigint NOT NULL,
    stored_bytes bigint NOT NULL,
    CONSTRAINT pk_tenant_usage PRIMARY KEY (tenant_id, stripe),
    CONSTRAINT fk_tenant_usage_tenant_id_tenants FOREIGN KEY (tenant_id)
        REFERENCES tenants (tenant_id) ON DELETE CASCADE
);
GRANT SELECT, INSERT, UPDATE, DELETE ON {", ".join(TABLES)} TO {APP_ROLE};
"""

# Stored = every row the tenant keeps: superseded and revoked versions are storage until they
# are erased or swept (counting live rows only let a tenant at its cap write the same key again
# and again: red-team finding). Bytes = what callers chose to store in the row: subject, key,
# value, source and metadata (metadata was not counted either). The stripe is the writing
# backend's: one transaction touches one counter row, and two connections writing at once
# usually touch two.
COUNTER = f"""
CREATE FUNCTION memgate_stored_bytes(m memories) RETURNS bigint LANGUAGE sql IMMUTABLE AS $$
    SELECT octet_length(m.subject) + octet_length(m.key) + octet_length(m.value)
         + coalesce(octet_length(m.source), 0) + octet_length(m.metadata::text)
$$;
CREATE FUNCTION memgate_count_usage() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    d_rows bigint := 0;
    d_bytes bigint := 0;
    t uuid;
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        d_rows := d_rows - 1;
        d_bytes := d_bytes - memgate_stored_bytes(OLD);
        t := OLD.tenant_id;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        d_rows := d_rows + 1;
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
CREATE TRIGGER memories_usage AFTER INSERT OR UPDATE OR DELETE ON memories
    FOR EACH ROW EXECUTE FUNCTION memgate_count_usage();
"""

# The owner is bound by FORCE ROW LEVEL SECURITY on memories; lifting it inside this
# transaction lets the one count see every tenant's rows (nobody else sees the gap).
BACKFILL = """
ALTER TABLE memories NO FORCE ROW LEVEL SECURITY;
INSERT INTO tenant_usage (tenant_id, stripe, stored_count, stored_bytes)
SELECT m.tenant_id, 0, count(*), coalesce(sum(memgate_stored_bytes(m)), 0)
  FROM memories m
 GROUP BY m.tenant_id;
ALTER TABLE memories FORCE ROW LEVEL SECURITY;
"""


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(SCHEMA)
    for table in TABLES:
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
        op.execute(
            f"CREATE POLICY {table}_tenant ON {table} TO {APP_ROLE} "
            f"USING ({TENANT}) WITH CHECK ({TENANT})"
        )
    op.execute(COUNTER)
    op.execute(BACKFILL)


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute("DROP TRIGGER memories_usage ON memories")
    op.execute("DROP FUNCTION memgate_count_usage()")
    op.execute("DROP FUNCTION memgate_stored_bytes(memories)")
    for table in reversed(TABLES):
        op.execute(f"DROP TABLE {table}")
