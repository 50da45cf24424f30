"""Row-level security on memories: the backstop behind Visible.

The app role meets FORCE ROW LEVEL SECURITY on `memories`: a row is readable only in the tenant
and by the principal named by the transaction-local settings `memgate.tenant_id` and
`memgate.principal_id` (set by the request with `set_config(..., true)`), in a space that
principal holds `read` on, with every `read_requires` space readable too; inserts need `write`
on the space, updates `write`, deletes `delete`. No settings, no rows. Visible applies the same
predicate in every statement; this catches a statement that forgot it.

Revision ID: 20261130_rls
Revises: 20261130_policy
Create Date: 2026-11-30 16:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "20261130_rls"
down_revision: str | Sequence[str] | None = "20261130_policy"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UPGRADE = """
-- The spaces the transaction's principal holds `action` on ('' settings match nothing).
CREATE FUNCTION memgate_granted(action text) RETURNS uuid[]
LANGUAGE sql STABLE PARALLEL SAFE SET search_path = public, pg_temp
RETURN (
    SELECT coalesce(array_agg(g.space_id), '{}')
      FROM space_grants g
     WHERE g.tenant_id = nullif(current_setting('memgate.tenant_id', true), '')::uuid
       AND g.principal_id = nullif(current_setting('memgate.principal_id', true), '')::uuid
       AND g.action = memgate_granted.action
);

CREATE FUNCTION memgate_tenant() RETURNS uuid
LANGUAGE sql STABLE PARALLEL SAFE
RETURN nullif(current_setting('memgate.tenant_id', true), '')::uuid;

ALTER TABLE memories ENABLE ROW LEVEL SECURITY;
ALTER TABLE memories FORCE ROW LEVEL SECURITY;

CREATE POLICY memories_read ON memories FOR SELECT TO memgate_app
    USING (tenant_id = (SELECT memgate_tenant())
           AND space_id = ANY (CAST((SELECT memgate_granted('read')) AS uuid[]))
           AND read_requires <@ (SELECT memgate_granted('read')));
CREATE POLICY memories_insert ON memories FOR INSERT TO memgate_app
    WITH CHECK (tenant_id = (SELECT memgate_tenant())
                AND space_id = ANY (CAST((SELECT memgate_granted('write')) AS uuid[])));
CREATE POLICY memories_update ON memories FOR UPDATE TO memgate_app
    USING (tenant_id = (SELECT memgate_tenant())
           AND space_id = ANY (CAST((SELECT memgate_granted('write')) AS uuid[])))
    WITH CHECK (tenant_id = (SELECT memgate_tenant())
                AND space_id = ANY (CAST((SELECT memgate_granted('write')) AS uuid[])));
CREATE POLICY memories_delete ON memories FOR DELETE TO memgate_app
    USING (tenant_id = (SELECT memgate_tenant())
           AND space_id = ANY (CAST((SELECT memgate_granted('delete')) AS uuid[])));

REVOKE ALL ON FUNCTION memgate_granted(text), memgate_tenant() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION memgate_granted(text), memgate_tenant() TO memgate_app;
"""

DOWNGRADE = """
DROP POLICY memories_delete ON memories;
DROP POLICY memories_update ON memories;
DROP POLICY memories_insert ON memories;
DROP POLICY memories_read ON memories;
ALTER TABLE memories NO FORCE ROW LEVEL SECURITY;
ALTER TABLE memories DISABLE ROW LEVEL SECURITY;
DROP FUNCTION memgate_tenant();
DROP FUNCTION memgate_granted(text);
"""


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(DOWNGRADE)
