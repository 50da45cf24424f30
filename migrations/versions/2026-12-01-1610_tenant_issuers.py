"""Per-tenant external issuers: each tenant registers the identity providers its own users and
agents log in with, and a token's (`iss`, `aud`) selects exactly one tenant.

- `tenant_issuers`: one row per registered IdP, keyed (tenant_id, id) like every tenant table,
  with row-level security on the tenant the transaction names. `(issuer, audience)` is unique
  across the whole platform (not per tenant): verification picks the tenant from that pair, so
  two tenants can never both claim it. And one registration per issuer per tenant
  (`tenant_id, issuer`): principals map to an issuer by its `iss` alone, so a second
  registration of that `iss` (another audience, another JWKS) would mint tokens for the
  principals mapped to the first (red-team pass on tenant issuers, F1).
- `memgate_tenant_issuer(issuer, audience)`: the one read token verification makes before any
  tenant is known. SECURITY DEFINER (owner-owned, fixed search_path) because row-level security
  hides every row until a tenant is named; it takes both halves of the unique key and returns
  at most that one row's verification config (tenant, id, JWKS URL, algorithms, claim names),
  never a list: nobody can enumerate registrations through it, and it writes nothing.

Revision ID: 20261201_tenant_issuers
Revises: 20261201_auditor_casbin_role
Create Date: 2026-12-01 16:10:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "20261201_tenant_issuers"
down_revision: str | Sequence[str] | None = "20261201_auditor_casbin_role"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

APP_ROLE = "memgate_app"
TENANT = "tenant_id = (SELECT memgate_tenant())"

UPGRADE = f"""
CREATE TABLE tenant_issuers (
    tenant_id uuid NOT NULL,
    id uuid NOT NULL,
    issuer text NOT NULL,
    audience text NOT NULL,
    jwks_url text NOT NULL,
    algorithms text[] NOT NULL,
    require_typ boolean NOT NULL DEFAULT true,
    subject_claim text NOT NULL DEFAULT 'sub',
    scope_claim text NOT NULL DEFAULT 'scope',
    client_id_claim text NOT NULL DEFAULT 'client_id',
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT pk_tenant_issuers PRIMARY KEY (tenant_id, id),
    CONSTRAINT uq_tenant_issuers_issuer_audience UNIQUE (issuer, audience),
    CONSTRAINT uq_tenant_issuers_tenant_id_issuer UNIQUE (tenant_id, issuer),
    CONSTRAINT fk_tenant_issuers_tenant_id_tenants FOREIGN KEY (tenant_id)
        REFERENCES tenants (tenant_id) ON DELETE CASCADE
);
ALTER TABLE tenant_issuers ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_issuers_tenant ON tenant_issuers TO {APP_ROLE}
    USING ({TENANT}) WITH CHECK ({TENANT});
GRANT SELECT, INSERT, DELETE ON tenant_issuers TO {APP_ROLE};

CREATE FUNCTION memgate_tenant_issuer(p_issuer text, p_audience text)
RETURNS TABLE (tenant_id uuid, id uuid, jwks_url text, algorithms text[], require_typ boolean,
               subject_claim text, scope_claim text, client_id_claim text)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp
AS $$
    SELECT i.tenant_id, i.id, i.jwks_url, i.algorithms, i.require_typ,
           i.subject_claim, i.scope_claim, i.client_id_claim
      FROM tenant_issuers i
     WHERE i.issuer = p_issuer AND i.audience = p_audience
$$;
REVOKE ALL ON FUNCTION memgate_tenant_issuer(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION memgate_tenant_issuer(text, text) TO {APP_ROLE};
"""


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute("DROP FUNCTION memgate_tenant_issuer(text, text)")
    op.execute("DROP TABLE tenant_issuers")
