"""Idempotency keys of the batch write (issue 14): `POST /v1/memories:batch` with an
`Idempotency-Key` keeps its answer for 24 hours.

- `idempotency_keys`: one row per (tenant, principal, client, key) that answered a batch: the
  SHA-256 of the request (same key, other body: 422), the status and body of the answer (the
  replay sends them again), the memory ids the answer names, and when it expires. Written in
  the batch's own transaction, so a batch that rolled back (or whose process died) leaves no
  row; a call still in flight holds a transaction-level advisory lock on the key instead
  (service/memory/idempotency.py), never a row that could outlive it.
- Row-level security by tenant, as every tenant table; the app role reads, inserts, updates and
  deletes them (an expired key is deleted by the next keyed batch of its tenant).
- `ix_idempotency_keys_expiry`: (tenant_id, expires_at), for that cleanup.
- `memgate_idempotency_forget()`: a trigger on `memories`. An answer holds memory content, so
  when one of its memories is deleted (erasure, sweep), retracted, revoked or expired in place
  (`memory.age_unused` sets `expires_at` to now), the stored body is dropped (the key stays,
  answering 410 `idempotency-answer-gone`): an erased or revoked value never comes back
  through a replay (promises 7 and 9). A memory that expires by its own TTL needs no update:
  the replay re-reads every memory of the answer through Visible (service/memory/service.py
  `_replay`), which also refuses a caller whose grants changed since.

Revision ID: 20261202_idempotency_keys
Revises: 20261201_job_fixes
Create Date: 2026-12-02 01:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "20261202_idempotency_keys"
down_revision: str | Sequence[str] | None = "20261201_job_fixes"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

APP_ROLE = "memgate_app"
TENANT = "tenant_id = (SELECT memgate_tenant())"

SCHEMA = f"""
CREATE TABLE idempotency_keys (
    tenant_id uuid NOT NULL,
    principal_id uuid NOT NULL,
    client_id text NOT NULL,
    key text NOT NULL,
    request_hash bytea NOT NULL,
    status integer NOT NULL,
    answer bytea,
    memory_ids uuid[] NOT NULL DEFAULT '{{}}',
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    CONSTRAINT pk_idempotency_keys PRIMARY KEY (tenant_id, principal_id, client_id, key),
    CONSTRAINT fk_idempotency_keys_tenant_id_tenants FOREIGN KEY (tenant_id)
        REFERENCES tenants (tenant_id) ON DELETE CASCADE
);
CREATE INDEX ix_idempotency_keys_expiry ON idempotency_keys (tenant_id, expires_at);
CREATE INDEX ix_idempotency_keys_memory_ids ON idempotency_keys USING gin (memory_ids);
ALTER TABLE idempotency_keys ENABLE ROW LEVEL SECURITY;
CREATE POLICY idempotency_keys_tenant ON idempotency_keys TO {APP_ROLE}
    USING ({TENANT}) WITH CHECK ({TENANT});
GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency_keys TO {APP_ROLE};
"""

FORGET = """
CREATE FUNCTION memgate_idempotency_forget() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    UPDATE idempotency_keys SET answer = NULL
     WHERE tenant_id = OLD.tenant_id AND memory_ids @> ARRAY[OLD.id] AND answer IS NOT NULL;
    RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION memgate_idempotency_forget() FROM PUBLIC;
CREATE TRIGGER memories_idempotency_deleted AFTER DELETE ON memories
    FOR EACH ROW EXECUTE FUNCTION memgate_idempotency_forget();
CREATE TRIGGER memories_idempotency_withdrawn AFTER UPDATE OF revoked_at, retracted_at ON memories
    FOR EACH ROW
    WHEN ((OLD.revoked_at IS NULL AND NEW.revoked_at IS NOT NULL)
          OR (OLD.retracted_at IS NULL AND NEW.retracted_at IS NOT NULL))
    EXECUTE FUNCTION memgate_idempotency_forget();
CREATE TRIGGER memories_idempotency_expired AFTER UPDATE OF expires_at ON memories
    FOR EACH ROW
    WHEN (NEW.expires_at IS NOT NULL AND NEW.expires_at <= now()
          AND (OLD.expires_at IS NULL OR OLD.expires_at > now()))
    EXECUTE FUNCTION memgate_idempotency_forget();
"""


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(SCHEMA)
    op.execute(FORGET)


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute("DROP TRIGGER memories_idempotency_expired ON memories")
    op.execute("DROP TRIGGER memories_idempotency_withdrawn ON memories")
    op.execute("DROP TRIGGER memories_idempotency_deleted ON memories")
    op.execute("DROP FUNCTION memgate_idempotency_forget()")
    op.execute("DROP TABLE idempotency_keys")
