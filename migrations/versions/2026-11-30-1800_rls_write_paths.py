"""Row-level security for writes and deletes demands read as well.

An UPDATE or DELETE whose WHERE names no column is checked against its own policy only (not
the SELECT policy), so a write-only or delete-only grant could change rows its holder cannot
read, derived rows included (red-team finding). Every write path now needs the space readable
and `read_requires` within what the caller reads, as Visible does.

Revision ID: 20261130_rls_writes
Revises: 20261130_delegation
Create Date: 2026-11-30 18:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "20261130_rls_writes"
down_revision: str | Sequence[str] | None = "20261130_delegation"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TENANT = "tenant_id = (SELECT memgate_tenant())"
READABLE = (
    "space_id = ANY (CAST((SELECT memgate_granted('read')) AS uuid[])) "
    "AND read_requires <@ (SELECT memgate_granted('read'))"
)


def _in(action: str) -> str:
    return f"space_id = ANY (CAST((SELECT memgate_granted('{action}')) AS uuid[]))"


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    write = f"{TENANT} AND {_in('write')} AND {READABLE}"
    op.execute(f"ALTER POLICY memories_insert ON memories WITH CHECK ({write})")
    op.execute(f"ALTER POLICY memories_update ON memories USING ({write}) WITH CHECK ({write})")
    op.execute(
        f"ALTER POLICY memories_delete ON memories USING ({TENANT} AND {_in('delete')} "
        f"AND {READABLE})"
    )


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    write = f"{TENANT} AND {_in('write')}"
    op.execute(f"ALTER POLICY memories_insert ON memories WITH CHECK ({write})")
    op.execute(f"ALTER POLICY memories_update ON memories USING ({write}) WITH CHECK ({write})")
    op.execute(f"ALTER POLICY memories_delete ON memories USING ({TENANT} AND {_in('delete')})")
