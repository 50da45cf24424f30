"""The auditor role is a Casbin role (review item M1: one role system).

- Every `role_assignments` row becomes the line `g, <kind>:<principal>, role:auditor, <tenant>`
  in `casbin_rule`, and the role closure (`principal_roles`) of those principals is rebuilt
  from their rules, so the audit guard reads the same compiled table as the policy-admin guard
  (one primary-key lookup). Their tenants' `policy_version` moves on: what a principal may do
  is part of the policy, and an auditor now also holds any grant an admin made to
  `role:auditor`, which reached nobody before.
- `role_assignments` is dropped (its row-level security policy and the app role's grants go
  with it): nothing else reads it.

Downgrade restores the table, as migrations `audit_log` and `app_role_narrowed` made it, with a
row for every principal that reaches role:auditor (through teams too: the old table had only
direct assignments), then deletes the `g` lines to role:auditor and rebuilds those principals'
closures.

Revision ID: 20261201_auditor_casbin_role
Revises: 20261201_audit_keys_owner_only
Create Date: 2026-12-01 14:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "20261201_auditor_casbin_role"
down_revision: str | Sequence[str] | None = "20261201_audit_keys_owner_only"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

APP_ROLE = "memgate_app"
AUDITOR = "role:auditor"
MAX_DEPTH = 10  # pycasbin's max_hierarchy_level, as in service/policy/compile.py
TENANT = "tenant_id = (SELECT memgate_tenant())"

# The closure of the principals in `touched` (tenant_id, principal_id), as
# service/policy/compile.py builds it: each principal's own name and every role it reaches.
REBUILD = f"""
DELETE FROM principal_roles r USING touched t
 WHERE r.tenant_id = t.tenant_id AND r.principal_id = t.principal_id;
INSERT INTO principal_roles (tenant_id, principal_id, role)
WITH RECURSIVE roles(tenant_id, principal_id, role, depth) AS (
    SELECT p.tenant_id, p.id, p.kind || ':' || p.id::text, 0
      FROM principals p JOIN touched t ON t.tenant_id = p.tenant_id AND t.principal_id = p.id
  UNION
    SELECT r.tenant_id, r.principal_id, g.v1, r.depth + 1
      FROM roles r
      JOIN casbin_rule g ON g.tenant_id = r.tenant_id AND g.ptype = 'g' AND g.v0 = r.role
     WHERE r.depth < {MAX_DEPTH}
)
SELECT DISTINCT tenant_id, principal_id, role FROM roles;
UPDATE tenants SET policy_version = policy_version + 1
 WHERE tenant_id IN (SELECT DISTINCT tenant_id FROM touched);
DROP TABLE touched;
"""

TO_RULES = f"""
CREATE TEMPORARY TABLE touched AS
    SELECT DISTINCT tenant_id, principal_id FROM role_assignments WHERE role = 'auditor';
INSERT INTO casbin_rule (tenant_id, ptype, v0, v1, v2)
SELECT a.tenant_id, 'g', p.kind || ':' || p.id::text, '{AUDITOR}', a.tenant_id::text
  FROM role_assignments a
  JOIN principals p ON p.tenant_id = a.tenant_id AND p.id = a.principal_id
 WHERE a.role = 'auditor'
ON CONFLICT DO NOTHING;
"""

TABLE = f"""
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
GRANT SELECT, INSERT, UPDATE, DELETE ON role_assignments TO {APP_ROLE};
ALTER TABLE role_assignments ENABLE ROW LEVEL SECURITY;
CREATE POLICY role_assignments_tenant ON role_assignments TO {APP_ROLE}
    USING ({TENANT}) WITH CHECK ({TENANT});
"""

FROM_RULES = f"""
CREATE TEMPORARY TABLE touched AS
    SELECT DISTINCT tenant_id, principal_id FROM principal_roles WHERE role = '{AUDITOR}';
INSERT INTO role_assignments (tenant_id, principal_id, role)
SELECT tenant_id, principal_id, 'auditor' FROM touched;
DELETE FROM casbin_rule WHERE ptype = 'g' AND v1 = '{AUDITOR}';
"""


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    # Old replicas may still grant or revoke auditors (and change policy) while this runs:
    # wait for changes in flight and hold off new ones until this commits; old replicas' later
    # role changes then fail on the missing table and roll back.
    op.execute("LOCK TABLE role_assignments, casbin_rule IN SHARE MODE")
    op.execute(TO_RULES)
    op.execute(REBUILD)
    op.execute("DROP TABLE role_assignments")


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute("LOCK TABLE casbin_rule, principal_roles IN SHARE MODE")
    op.execute(TABLE)
    op.execute(FROM_RULES)
    op.execute(REBUILD)
