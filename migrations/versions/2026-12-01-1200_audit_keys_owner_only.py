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
- Checkpoints are written only through `audit_checkpoint_insert` (SECURITY DEFINER, the
  owner's): the row's tenant must be the one the transaction names, its (seq, row_hash) a row
  of that tenant's chain, its kid an audit key. The app role loses INSERT on the table: junk it
  planted at seqs past the head hid every real checkpoint from `latest` and took the seqs the
  signer and the row-N checkpoints needed (red-team round 2, F1).

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

CHECKPOINT_INSERT = f"""
CREATE FUNCTION audit_checkpoint_insert(
    p_tenant uuid, p_seq bigint, p_row_hash bytea, p_signed_at timestamptz, p_kid text,
    p_jws text
) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
BEGIN
    IF p_tenant IS DISTINCT FROM memgate_tenant() THEN
        RAISE EXCEPTION 'a checkpoint only for the tenant the transaction names'
            USING ERRCODE = '42501';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM audit_events
                    WHERE tenant_id = p_tenant AND seq = p_seq AND row_hash = p_row_hash) THEN
        RAISE EXCEPTION 'a checkpoint only for a row of the chain' USING ERRCODE = '22023';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM audit_signing_keys WHERE kid = p_kid) THEN
        RAISE EXCEPTION 'a checkpoint only under an audit key' USING ERRCODE = '22023';
    END IF;
    INSERT INTO audit_checkpoints (tenant_id, seq, row_hash, signed_at, kid, jws)
    VALUES (p_tenant, p_seq, p_row_hash, p_signed_at, p_kid, p_jws)
    ON CONFLICT (tenant_id, seq) DO NOTHING;
    RETURN FOUND;
END
$$;
REVOKE ALL ON FUNCTION audit_checkpoint_insert(uuid, bigint, bytea, timestamptz, text, text)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION audit_checkpoint_insert(uuid, bigint, bytea, timestamptz, text, text)
    TO {APP_ROLE};
"""


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
    op.execute(f"REVOKE INSERT ON audit_checkpoints FROM {APP_ROLE}")
    op.execute(CHECKPOINT_INSERT)


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(
        "DROP FUNCTION audit_checkpoint_insert(uuid, bigint, bytea, timestamptz, text, text)"
    )
    op.execute(f"GRANT INSERT ON audit_checkpoints TO {APP_ROLE}")
    op.execute("DROP POLICY audit_checkpoints_insert ON audit_checkpoints")
    op.execute("DROP POLICY audit_checkpoints_read ON audit_checkpoints")
    op.execute("ALTER TABLE audit_checkpoints DISABLE ROW LEVEL SECURITY")
    op.execute(f"GRANT INSERT ON audit_signing_keys TO {APP_ROLE}")
