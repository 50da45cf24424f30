"""The app role narrowed: no token keys, audit rows only for its own tenant, row-level security
on every tenant table (review items 5, 6 and 15).

- `signing_keys`: the app role keeps SELECT (it signs and publishes) and loses INSERT, UPDATE
  and DELETE. A public key it could insert was published in the JWKS and its tokens accepted
  for any tenant; keys are now generated and rotated through the owner role only (`memgate
  migrate`, `memgate keys rotate`, and the embedded service, which migrates as the owner).
- `audit_append()` appends only to the chain of the tenant the transaction names
  (`memgate.tenant_id`, set with `set_config(..., true)`), and only for a tenant that exists
  (or the platform chain, the zero UUID).
- Row-level security keyed on `memgate.tenant_id` (as on memories) on every other tenant table.
  ENABLE, not FORCE: FORCE binds only the owner, which is the migration role, and the narrow
  SECURITY DEFINER entrances below run as it. `space_grants` becomes a security-invoker view,
  so the app reads grants through the policies of the tables beneath it.
- `memgate_token_client(client_id)`: the one read the token endpoint makes before it knows the
  tenant: the enabled client with that id and an enabled principal, only what the grant needs.

Revision ID: 20261201_app_role_narrowed
Revises: 20261130_grant_closures
Create Date: 2026-12-01 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "20261201_app_role_narrowed"
down_revision: str | Sequence[str] | None = "20261130_grant_closures"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

APP_ROLE = "memgate_app"
TENANT_TABLES = (
    "principals",
    "clients",
    "spaces",
    "teams",
    "role_assignments",
    "casbin_rule",
    "principal_roles",
    "role_grants",
    "delegations",
    "audit_actors",
    "audit_pseudonym_keys",
)
TENANT = "tenant_id = (SELECT memgate_tenant())"


# The body of 20261130_audit's audit_append, with GUARDS in front.
APPEND = r"""
CREATE OR REPLACE FUNCTION audit_append(
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
    %(guards)s
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
# A row goes to the chain of the tenant the transaction names (the caller, set by the request
# with set_config(..., true)), never to one an argument picks; and only to a tenant that exists
# (the zero UUID is the platform chain of unauthenticated calls, which has no tenants row).
GUARDS = """
    IF p_tenant_id IS DISTINCT FROM nullif(current_setting('memgate.tenant_id', true), '')::uuid
    THEN
        RAISE EXCEPTION 'an audit row goes only to the chain of the transaction''s tenant'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF p_tenant_id <> '00000000-0000-0000-0000-000000000000'::uuid
       AND NOT EXISTS (SELECT 1 FROM tenants t WHERE t.tenant_id = p_tenant_id) THEN
        RAISE EXCEPTION 'no such tenant' USING ERRCODE = 'foreign_key_violation';
    END IF;
"""

CLIENT_LOOKUP = """
CREATE FUNCTION memgate_token_client(p_client_id uuid)
RETURNS TABLE (tenant_id uuid, principal_id uuid, kind text, secret_hash text,
               allowed_scopes text[])
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp
AS $$
    SELECT c.tenant_id, c.principal_id, c.kind, c.secret_hash, c.allowed_scopes
      FROM clients c
      JOIN principals p ON p.tenant_id = c.tenant_id AND p.id = c.principal_id
     WHERE c.client_id = p_client_id AND c.disabled_at IS NULL AND p.disabled_at IS NULL
$$;
REVOKE ALL ON FUNCTION memgate_token_client(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION memgate_token_client(uuid) TO memgate_app;
"""


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(f"REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON signing_keys FROM {APP_ROLE}")
    op.execute(APPEND % {"guards": GUARDS})
    for table in TENANT_TABLES:
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
        op.execute(
            f"CREATE POLICY {table}_tenant ON {table} TO {APP_ROLE} "
            f"USING ({TENANT}) WITH CHECK ({TENANT})"
        )
    op.execute("ALTER VIEW space_grants SET (security_invoker = true)")
    op.execute(CLIENT_LOOKUP)


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute("DROP FUNCTION memgate_token_client(uuid)")
    op.execute("ALTER VIEW space_grants RESET (security_invoker)")
    for table in reversed(TENANT_TABLES):
        op.execute(f"DROP POLICY {table}_tenant ON {table}")
        op.execute(f"ALTER TABLE {table} DISABLE ROW LEVEL SECURITY")
    op.execute(APPEND % {"guards": ""})
    op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON signing_keys TO {APP_ROLE}")
