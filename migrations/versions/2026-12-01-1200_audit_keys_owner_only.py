"""Audit keys and checkpoints are the owner's (red-team follow-up to review items 5 and 6).

- `audit_signing_keys`: the app role keeps SELECT (it signs checkpoints and publishes the keys)
  and loses INSERT. A key it inserted was trusted: the newest unretired one stopped every
  tenant's calls (the signer could not unseal it), and a retired one whose private half the
  planter held made its forged checkpoints verify. Audit keys are now made by the owner
  (`memgate migrate`, and `serve`, which migrates as the owner), like token keys.
- `audit_checkpoints`: row-level security for the app role. It may read every checkpoint (the
  timed signer walks every chain, as it reads every head) but insert only for the tenant the
  transaction names (`memgate.tenant_id`): a login that names no tenant can no longer plant a
  row in another tenant's chain.

Revision ID: 20261201_audit_keys_owner_only
Revises: 20261201_app_role_narrowed
Create Date: 2026-12-01 12:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "20261201_audit_keys_owner_only"
down_revision: str | Sequence[str] | None = "20261201_app_role_narrowed"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

APP_ROLE = "memgate_app"
TENANT = "tenant_id = (SELECT memgate_tenant())"


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(f"REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON audit_signing_keys FROM {APP_ROLE}")
    op.execute("ALTER TABLE audit_checkpoints ENABLE ROW LEVEL SECURITY")
    op.execute(
        f"CREATE POLICY audit_checkpoints_read ON audit_checkpoints FOR SELECT TO {APP_ROLE} "
        "USING (true)"
    )
    op.execute(
        f"CREATE POLICY audit_checkpoints_insert ON audit_checkpoints FOR INSERT TO {APP_ROLE} "
        f"WITH CHECK ({TENANT})"
    )


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute("DROP POLICY audit_checkpoints_insert ON audit_checkpoints")
    op.execute("DROP POLICY audit_checkpoints_read ON audit_checkpoints")
    op.execute("ALTER TABLE audit_checkpoints DISABLE ROW LEVEL SECURITY")
    op.execute(f"GRANT INSERT ON audit_signing_keys TO {APP_ROLE}")
