"""Tenants as a product: the platform tenant, disabled and retired tenants, per-tenant
settings, and row-level security on `tenants` (docs/security.md named its absence a gap).

- `is_platform` (at most one row, a unique partial index): the tenant whose `manage:tenant`
  holders administer all tenants. On an existing deployment the oldest tenant is the first
  start's "default" and becomes the platform tenant.
- `disabled_at`: every token of a disabled tenant stops on its next request (the entrance
  statement, the external and delegated paths and `memgate_token_client` read it).
- `retired_at`: a deleted tenant's row stays (its audit chain stays, its id is never reused).
- `settings` (jsonb, validated by service/tenants/settings.py) and `updated_at`.
- Row-level security: a transaction sees the row of the tenant it names; one naming the
  platform tenant sees (and may update) every row. Whether the named tenant is the platform
  tenant is asked through `memgate_named_platform()`, a SECURITY DEFINER function owned by the
  owner (which the ENABLE-only policy does not bind), so the policy does not recurse into
  itself. It returns one boolean about the tenant the transaction names, nothing else.
  Inserting a tenant needs the platform tenant named, or no platform tenant yet (the first
  start's bootstrap); the app role cannot delete tenants at all. A trigger refuses changes to
  the lifecycle columns (name, settings, disabled, retired, is_platform) unless the platform
  tenant is named: a tenant's own calls may move its `policy_version` only.

Revision ID: 20261201_tenants_lifecycle
Revises: 20261201_quotas
Create Date: 2026-12-01 16:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "20261201_tenants_lifecycle"
down_revision: str | Sequence[str] | None = "20261201_quotas"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

APP_ROLE = "memgate_app"
OWN_OR_PLATFORM = "tenant_id = (SELECT memgate_tenant()) OR (SELECT memgate_named_platform())"

FUNCTIONS = f"""
CREATE FUNCTION memgate_named_platform() RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp
RETURN coalesce((SELECT t.is_platform FROM tenants t
                  WHERE t.tenant_id = memgate_tenant() AND t.disabled_at IS NULL), false);
CREATE FUNCTION memgate_platform_exists() RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp
RETURN EXISTS (SELECT 1 FROM tenants t WHERE t.is_platform);
REVOKE ALL ON FUNCTION memgate_named_platform(), memgate_platform_exists() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION memgate_named_platform(), memgate_platform_exists() TO {APP_ROLE};

CREATE FUNCTION memgate_tenant_lifecycle_guard() RETURNS trigger
LANGUAGE plpgsql SET search_path = public, pg_temp AS $$
BEGIN
    IF (NEW.tenant_id, NEW.name, NEW.settings, NEW.disabled_at, NEW.retired_at, NEW.is_platform,
        NEW.created_at)
       IS DISTINCT FROM
       (OLD.tenant_id, OLD.name, OLD.settings, OLD.disabled_at, OLD.retired_at, OLD.is_platform,
        OLD.created_at)
       AND current_user <> (SELECT r.rolname FROM pg_roles r
                             JOIN pg_class c ON c.relowner = r.oid
                            WHERE c.oid = 'tenants'::regclass)
       AND NOT memgate_named_platform() THEN
        RAISE EXCEPTION 'only the platform tenant changes a tenant''s lifecycle or settings'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER tenants_lifecycle_guard BEFORE UPDATE ON tenants
    FOR EACH ROW EXECUTE FUNCTION memgate_tenant_lifecycle_guard();

ALTER TABLE tenants ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenants_read ON tenants FOR SELECT TO {APP_ROLE} USING ({OWN_OR_PLATFORM});
CREATE POLICY tenants_update ON tenants FOR UPDATE TO {APP_ROLE}
    USING ({OWN_OR_PLATFORM}) WITH CHECK ({OWN_OR_PLATFORM});
CREATE POLICY tenants_insert ON tenants FOR INSERT TO {APP_ROLE}
    WITH CHECK ((SELECT memgate_named_platform()) OR NOT (SELECT memgate_platform_exists()));
REVOKE DELETE, TRUNCATE ON tenants FROM {APP_ROLE};
"""

# A deletion's plan and its execution: the platform admin counts and removes another tenant's
# rows, which row-level security rightly hides from it (memories are FORCE'd), through these two
# functions only. Each answers only to a transaction naming the platform tenant, never for the
# platform tenant itself; the plan returns counts, never content. The audit chain (and the
# pseudonym keys and actors it is read with) stays: it is append-only by design.
PLAN = f"""
CREATE FUNCTION memgate_tenant_plan(p_tenant uuid)
RETURNS TABLE (memory_count bigint, space_count bigint, principal_count bigint,
               client_count bigint, policy_rule_count bigint, audit_row_count bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    IF NOT memgate_named_platform() THEN
        RAISE EXCEPTION 'only the platform tenant plans a deletion'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN QUERY SELECT
        (SELECT count(*) FROM memories m WHERE m.tenant_id = p_tenant),
        (SELECT count(*) FROM spaces s WHERE s.tenant_id = p_tenant),
        (SELECT count(*) FROM principals p WHERE p.tenant_id = p_tenant),
        (SELECT count(*) FROM clients c WHERE c.tenant_id = p_tenant),
        (SELECT count(*) FROM casbin_rule r WHERE r.tenant_id = p_tenant),
        (SELECT coalesce(max(h.seq), 0) FROM audit_heads h WHERE h.tenant_id = p_tenant);
END $$;
CREATE FUNCTION memgate_retire_tenant(p_tenant uuid) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    removed bigint := 0;
    n bigint;
BEGIN
    IF NOT memgate_named_platform() THEN
        RAISE EXCEPTION 'only the platform tenant deletes a tenant'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    PERFORM 1 FROM tenants t WHERE t.tenant_id = p_tenant AND NOT t.is_platform
        AND t.disabled_at IS NOT NULL AND t.retired_at IS NULL FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'only a disabled, unretired, non-platform tenant is deleted'
            USING ERRCODE = 'check_violation';
    END IF;
    DELETE FROM memories WHERE tenant_id = p_tenant; GET DIAGNOSTICS n = ROW_COUNT;
    removed := removed + n;
    DELETE FROM delegations WHERE tenant_id = p_tenant; GET DIAGNOSTICS n = ROW_COUNT;
    removed := removed + n;
    DELETE FROM role_grants WHERE tenant_id = p_tenant; GET DIAGNOSTICS n = ROW_COUNT;
    removed := removed + n;
    DELETE FROM principal_roles WHERE tenant_id = p_tenant; GET DIAGNOSTICS n = ROW_COUNT;
    removed := removed + n;
    DELETE FROM casbin_rule WHERE tenant_id = p_tenant; GET DIAGNOSTICS n = ROW_COUNT;
    removed := removed + n;
    DELETE FROM teams WHERE tenant_id = p_tenant; GET DIAGNOSTICS n = ROW_COUNT;
    removed := removed + n;
    DELETE FROM clients WHERE tenant_id = p_tenant; GET DIAGNOSTICS n = ROW_COUNT;
    removed := removed + n;
    DELETE FROM spaces WHERE tenant_id = p_tenant; GET DIAGNOSTICS n = ROW_COUNT;
    removed := removed + n;
    DELETE FROM principals WHERE tenant_id = p_tenant; GET DIAGNOSTICS n = ROW_COUNT;
    removed := removed + n;
    -- The tenant's configuration goes too: its IdP registrations (a pair it held would stay
    -- taken for ever) and its quotas' rows (after the memories, whose trigger counts usage).
    DELETE FROM tenant_issuers WHERE tenant_id = p_tenant; GET DIAGNOSTICS n = ROW_COUNT;
    removed := removed + n;
    DELETE FROM tenant_limits WHERE tenant_id = p_tenant;
    DELETE FROM quota_buckets WHERE tenant_id = p_tenant;
    DELETE FROM quota_slots WHERE tenant_id = p_tenant;
    DELETE FROM tenant_usage WHERE tenant_id = p_tenant;
    UPDATE tenants SET retired_at = now(), updated_at = now(), settings = '{{}}'::jsonb
     WHERE tenant_id = p_tenant;
    RETURN removed;
END $$;
REVOKE ALL ON FUNCTION memgate_tenant_plan(uuid), memgate_retire_tenant(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION memgate_tenant_plan(uuid), memgate_retire_tenant(uuid) TO {APP_ROLE};
"""

# memgate_token_client as 20261201_app_role_narrowed made it, plus: the tenant is enabled.
TOKEN_CLIENT = f"""
CREATE OR REPLACE FUNCTION memgate_token_client(p_client_id uuid)
RETURNS TABLE (tenant_id uuid, principal_id uuid, kind text, secret_hash text,
               allowed_scopes text[])
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp
AS $$
    SELECT c.tenant_id, c.principal_id, c.kind, c.secret_hash, c.allowed_scopes
      FROM clients c
      JOIN principals p ON p.tenant_id = c.tenant_id AND p.id = c.principal_id
      %(tenant)s
     WHERE c.client_id = p_client_id AND c.disabled_at IS NULL AND p.disabled_at IS NULL
$$;
REVOKE ALL ON FUNCTION memgate_token_client(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION memgate_token_client(uuid) TO {APP_ROLE};
"""
ENABLED_TENANT = "JOIN tenants t ON t.tenant_id = c.tenant_id AND t.disabled_at IS NULL"


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.add_column(
        "tenants",
        sa.Column("is_platform", sa.Boolean(), server_default=sa.false(), nullable=False),
    )
    op.add_column("tenants", sa.Column("disabled_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("tenants", sa.Column("retired_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column(
        "tenants",
        sa.Column(
            "settings",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
    )
    op.add_column(
        "tenants",
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
    )
    op.create_index(
        "uq_tenants_platform",
        "tenants",
        ["is_platform"],
        unique=True,
        postgresql_where=sa.text("is_platform"),
    )
    # The first start's "default" tenant is the oldest one.
    op.execute(
        "UPDATE tenants SET is_platform = true WHERE tenant_id = "
        "(SELECT tenant_id FROM tenants ORDER BY created_at, tenant_id LIMIT 1)"
    )
    op.execute(FUNCTIONS)
    op.execute(PLAN)
    op.execute(TOKEN_CLIENT % {"tenant": ENABLED_TENANT})


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(TOKEN_CLIENT % {"tenant": ""})
    op.execute("DROP FUNCTION memgate_tenant_plan(uuid), memgate_retire_tenant(uuid)")
    op.execute(f"GRANT DELETE, TRUNCATE ON tenants TO {APP_ROLE}")
    for policy in ("tenants_insert", "tenants_update", "tenants_read"):
        op.execute(f"DROP POLICY {policy} ON tenants")
    op.execute("ALTER TABLE tenants DISABLE ROW LEVEL SECURITY")
    op.execute("DROP TRIGGER tenants_lifecycle_guard ON tenants")
    op.execute("DROP FUNCTION memgate_tenant_lifecycle_guard()")
    op.execute("DROP FUNCTION memgate_named_platform(), memgate_platform_exists()")
    op.drop_index("uq_tenants_platform", table_name="tenants")
    for column in ("updated_at", "settings", "retired_at", "disabled_at", "is_platform"):
        op.drop_column("tenants", column)
