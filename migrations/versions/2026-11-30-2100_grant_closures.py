"""Grants are two closures joined at read time, not their product.

`space_grants` used to hold every (principal, action, space) the rules allow: a grant to a
team of 2,000 over a 300-space tree wrote 1.8 M rows inside the policy lock. Now:

- `principal_roles(principal, role)`: each principal and every team or role it reaches
  through `g` links (its own name included);
- `role_grants(role, action, space)`: each `p` rule expanded over the sub-spaces it reaches
  through `g2` links;
- `space_grants` is a view joining the two, with the same columns as the old table, so every
  reader (Visible, row-level security, explanations) is unchanged. A grant change rewrites one
  subject's grants; a membership change rewrites the roles of the principals that reach the
  member.

Revision ID: 20261130_grant_closures
Revises: 20261130_ann_index
Create Date: 2026-11-30 21:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "20261130_grant_closures"
down_revision: str | Sequence[str] | None = "20261130_ann_index"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

MAX_DEPTH = 10  # pycasbin's max_hierarchy_level, as in service/policy/compile.py

TABLES = """
CREATE TABLE principal_roles (
    tenant_id uuid NOT NULL,
    principal_id uuid NOT NULL,
    role text NOT NULL,
    CONSTRAINT pk_principal_roles PRIMARY KEY (tenant_id, principal_id, role)
);
CREATE INDEX ix_principal_roles_tenant_id_role ON principal_roles (tenant_id, role);
CREATE TABLE role_grants (
    tenant_id uuid NOT NULL,
    role text NOT NULL,
    action text NOT NULL,
    space_id uuid NOT NULL,
    CONSTRAINT pk_role_grants PRIMARY KEY (tenant_id, role, action, space_id),
    CONSTRAINT ck_role_grants_action CHECK (action IN ('read', 'write', 'delete'))
);
CREATE INDEX ix_role_grants_tenant_id_space_id_action ON role_grants
    (tenant_id, space_id, action);
GRANT SELECT, INSERT, DELETE ON principal_roles, role_grants TO memgate_app;
"""
FILL = f"""
INSERT INTO principal_roles (tenant_id, principal_id, role)
WITH RECURSIVE roles(tenant_id, principal_id, role, depth) AS (
    SELECT p.tenant_id, p.id, p.kind || ':' || p.id::text, 0 FROM principals p
  UNION
    SELECT r.tenant_id, r.principal_id, g.v1, r.depth + 1
      FROM roles r
      JOIN casbin_rule g ON g.tenant_id = r.tenant_id AND g.ptype = 'g' AND g.v0 = r.role
     WHERE r.depth < {MAX_DEPTH}
)
SELECT DISTINCT tenant_id, principal_id, role FROM roles;

INSERT INTO role_grants (tenant_id, role, action, space_id)
WITH RECURSIVE reach(tenant_id, role, action, obj, depth) AS (
    SELECT p.tenant_id, p.v0, p.v3, p.v2, 0 FROM casbin_rule p WHERE p.ptype = 'p'
  UNION
    SELECT r.tenant_id, r.role, r.action, e.v0, r.depth + 1
      FROM reach r
      JOIN casbin_rule e ON e.tenant_id = r.tenant_id AND e.ptype = 'g2' AND e.v1 = r.obj
     WHERE r.depth < {MAX_DEPTH}
)
SELECT DISTINCT r.tenant_id, r.role, r.action, s.id
  FROM reach r JOIN spaces s ON s.tenant_id = r.tenant_id AND r.obj = 'space:' || s.id::text;
"""
VIEW = """
CREATE VIEW space_grants AS
SELECT DISTINCT r.tenant_id, r.principal_id, g.action, g.space_id
  FROM principal_roles r
  JOIN role_grants g ON g.tenant_id = r.tenant_id AND g.role = r.role;
GRANT SELECT ON space_grants TO memgate_app;
"""
# memgate_granted() (migration 20261130_delegation) names space_grants; a function with a SQL
# body is bound to the relation, not the name, so it is re-created over the view.
GRANTED = """
CREATE OR REPLACE FUNCTION memgate_granted(action text) RETURNS uuid[]
LANGUAGE sql STABLE PARALLEL SAFE SET search_path = public, pg_temp
RETURN (
    SELECT coalesce(array_agg(g.space_id), '{}')
      FROM space_grants g
     WHERE g.tenant_id = nullif(current_setting('memgate.tenant_id', true), '')::uuid
       AND g.principal_id = nullif(current_setting('memgate.principal_id', true), '')::uuid
       AND g.action = memgate_granted.action
       AND (nullif(current_setting('memgate.actor_id', true), '') IS NULL
            OR EXISTS (SELECT 1 FROM space_grants a
                        WHERE a.tenant_id = g.tenant_id
                          AND a.principal_id =
                              nullif(current_setting('memgate.actor_id', true), '')::uuid
                          AND a.action = g.action
                          AND a.space_id = g.space_id))
);
"""


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    # Old replicas may still change policy while this runs: wait for changes in flight, and
    # hold off new ones, before the closures are read from the rules (red-team: a revoke that
    # committed between FILL and the rename came back). Held until this migration commits;
    # old replicas' later changes then fail on the view and roll back.
    op.execute("LOCK TABLE casbin_rule, space_grants IN SHARE MODE")
    op.execute(TABLES)
    op.execute(FILL)
    op.execute("ALTER TABLE space_grants RENAME TO space_grants_materialized")
    op.execute(VIEW)
    op.execute(GRANTED)
    op.execute("DROP TABLE space_grants_materialized")


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute("LOCK TABLE casbin_rule, principal_roles, role_grants IN SHARE MODE")
    op.execute("ALTER VIEW space_grants RENAME TO space_grants_joined")
    op.execute(
        """
        CREATE TABLE space_grants (
            tenant_id uuid NOT NULL,
            principal_id uuid NOT NULL,
            action text NOT NULL,
            space_id uuid NOT NULL,
            CONSTRAINT pk_space_grants PRIMARY KEY (tenant_id, principal_id, action, space_id),
            CONSTRAINT ck_space_grants_action CHECK (action IN ('read', 'write', 'delete'))
        );
        CREATE INDEX ix_space_grants_tenant_id_space_id_action ON space_grants
            (tenant_id, space_id, action);
        GRANT SELECT, INSERT, UPDATE, DELETE ON space_grants TO memgate_app;
        INSERT INTO space_grants SELECT * FROM space_grants_joined;
        """
    )
    op.execute(GRANTED)
    op.execute("DROP VIEW space_grants_joined")
    op.execute("DROP TABLE role_grants, principal_roles")
