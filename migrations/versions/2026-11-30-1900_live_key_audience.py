"""The live-key unique index includes the audience (`read_requires`).

A derived memory and a plain one with the same subject, kind and key in one space used to be
one key: a writer who could not see the derived row hit the unique index (a 500 that told it
the hidden row existed) or closed a version it could not read (red-team finding). Now each
audience has its own chain.

Revision ID: 20261130_live_key
Revises: 20261130_rls_writes
Create Date: 2026-11-30 19:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "20261130_live_key"
down_revision: str | Sequence[str] | None = "20261130_rls_writes"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

LIVE = "superseded_at IS NULL AND revoked_at IS NULL"


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute("DROP INDEX uq_memories_live_key")
    op.execute(
        "CREATE UNIQUE INDEX uq_memories_live_key ON memories "
        f"(tenant_id, space_id, subject, kind, key, read_requires) WHERE {LIVE}"
    )


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute("DROP INDEX uq_memories_live_key")
    op.execute(
        "CREATE UNIQUE INDEX uq_memories_live_key ON memories "
        f"(tenant_id, space_id, subject, kind, key) WHERE {LIVE}"
    )
