"""Per-space settings: the write gate and the evidence gate (issue 12).

- `spaces.settings` (jsonb, validated by service/policy/space_settings.py): `write_gate`
  (default on: a new key for a subject that already has live memories of the same kind
  under other keys answers 409 `key-choice-required`) and `evidence_gate` (default off:
  summaries and decisions must cite `derived_from`). An empty object means the defaults.
  Set through `PUT /v1/spaces/{id}/settings` by a policy admin. No new table: the column is
  under the `spaces` policies (row-level security by tenant) and the app role's grants that
  already cover the table.

Revision ID: 20261201_space_gates
Revises: 20261201_tenants_lifecycle
Create Date: 2026-12-01 17:20:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "20261201_space_gates"
down_revision: str | Sequence[str] | None = "20261201_stable_versions"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.add_column(
        "spaces",
        sa.Column(
            "settings",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
    )


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.drop_column("spaces", "settings")
