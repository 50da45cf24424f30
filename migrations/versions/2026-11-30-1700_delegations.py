"""Delegation: a user allows an agent to act for it (RFC 8693 token exchange), and a delegated
request sees only what both may see.

`delegations` holds each consent; the token of a delegated call names the user as `sub` and the
agent as `act.sub`, and resolution checks the consent on every request (revoking it bites at
once). `memgate_granted()` now intersects the user's grants with the actor's when the
transaction names one (`memgate.actor_id`), so row-level security agrees with Visible.

Revision ID: 20261130_delegation
Revises: 20261130_rls
Create Date: 2026-11-30 17:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "20261130_delegation"
down_revision: str | Sequence[str] | None = "20261130_rls"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

GRANTED = """
CREATE OR REPLACE FUNCTION memgate_granted(action text) RETURNS uuid[]
LANGUAGE sql STABLE PARALLEL SAFE SET search_path = public, pg_temp
RETURN (
    SELECT coalesce(array_agg(g.space_id), '{}')
      FROM space_grants g
     WHERE g.tenant_id = nullif(current_setting('memgate.tenant_id', true), '')::uuid
       AND g.principal_id = nullif(current_setting('memgate.principal_id', true), '')::uuid
       AND g.action = memgate_granted.action
       %s
);
"""
ACTOR = """
       AND (nullif(current_setting('memgate.actor_id', true), '') IS NULL
            OR EXISTS (SELECT 1 FROM space_grants a
                        WHERE a.tenant_id = g.tenant_id
                          AND a.principal_id =
                              nullif(current_setting('memgate.actor_id', true), '')::uuid
                          AND a.action = g.action
                          AND a.space_id = g.space_id))
"""

UPGRADE = """
CREATE TABLE delegations (
    tenant_id uuid NOT NULL,
    user_id uuid NOT NULL,
    agent_id uuid NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT pk_delegations PRIMARY KEY (tenant_id, user_id, agent_id),
    CONSTRAINT fk_delegations_tenant_id_user_id_principals FOREIGN KEY (tenant_id, user_id)
        REFERENCES principals (tenant_id, id) ON DELETE CASCADE,
    CONSTRAINT fk_delegations_tenant_id_agent_id_principals FOREIGN KEY (tenant_id, agent_id)
        REFERENCES principals (tenant_id, id) ON DELETE CASCADE
);
GRANT SELECT, INSERT, DELETE ON delegations TO memgate_app;
"""


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(UPGRADE)
    op.execute(GRANTED % ACTOR)


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(GRANTED % "")
    op.execute("DROP TABLE delegations")
