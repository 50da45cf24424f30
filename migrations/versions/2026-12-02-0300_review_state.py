"""A review state for untrusted writes (issue 15; docs/concepts.md, "Review").

- `memories.review_state` (NULL | 'proposed' | 'rejected'), with the decision's
  `review_reason`, `reviewed_by` and `reviewed_at`; `memories.confidence` (0..1, optional, as
  the writer said).
- `uq_memories_live_key` leaves proposals and tombstones out: a proposal does not hold its
  key's live slot (it supersedes nothing until approved).
- `ix_memories_visible_scan` and `ix_memories_visible_count` also hold `review_state` and
  `writer_id`, the columns of Visible's review clause, so exact search and counts stay
  index-only scans.
- The policy action `review` (casbin `p` rules and the compiled `role_grants`).
- `review_rejections(tenant_id, space_id, text_hash, memory_id, rejected_at)`: the hash of each
  rejected proposal's normalized text per space (no content), which refuses a re-proposal.
  Row-level security by tenant, as every tenant table.

Revision ID: 20261202_review_state
Revises: 20261202_revocation
Create Date: 2026-12-02 03:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "20261202_review_state"
down_revision: str | Sequence[str] | None = "20261202_revocation"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

APP_ROLE = "memgate_app"
TENANT = "tenant_id = (SELECT memgate_tenant())"
LIVE = "superseded_at IS NULL AND revoked_at IS NULL"

COLUMNS = """
ALTER TABLE memories
    ADD COLUMN review_state text,
    ADD COLUMN review_reason text,
    ADD COLUMN reviewed_by uuid,
    ADD COLUMN reviewed_at timestamptz,
    ADD COLUMN confidence double precision,
    ADD CONSTRAINT ck_memories_review_state
        CHECK (review_state IS NULL OR review_state IN ('proposed', 'rejected')),
    ADD CONSTRAINT ck_memories_confidence CHECK (confidence >= 0 AND confidence <= 1);
"""

REJECTIONS = f"""
CREATE TABLE review_rejections (
    tenant_id uuid NOT NULL,
    space_id uuid NOT NULL,
    text_hash bytea NOT NULL,
    memory_id uuid NOT NULL,
    rejected_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT pk_review_rejections PRIMARY KEY (tenant_id, space_id, text_hash),
    CONSTRAINT fk_review_rejections_tenant_id_space_id_spaces FOREIGN KEY (tenant_id, space_id)
        REFERENCES spaces (tenant_id, id) ON DELETE CASCADE
);
GRANT SELECT, INSERT, DELETE ON review_rejections TO {APP_ROLE};
ALTER TABLE review_rejections ENABLE ROW LEVEL SECURITY;
CREATE POLICY review_rejections_tenant ON review_rejections TO {APP_ROLE}
    USING ({TENANT}) WITH CHECK ({TENANT});
"""


def _actions(*actions: str) -> str:
    listed = ", ".join(f"'{action}'" for action in actions)
    return f"""
ALTER TABLE casbin_rule DROP CONSTRAINT ck_casbin_rule_shape;
ALTER TABLE casbin_rule ADD CONSTRAINT ck_casbin_rule_shape CHECK (
    (ptype = 'p' AND v1 = tenant_id::text AND v3 IN ({listed}))
    OR (ptype IN ('g', 'g2') AND v2 = tenant_id::text AND v3 IS NULL));
ALTER TABLE role_grants DROP CONSTRAINT ck_role_grants_action;
ALTER TABLE role_grants ADD CONSTRAINT ck_role_grants_action CHECK (action IN ({listed}));
"""


def _indexes(*extra: str) -> str:
    included = ", ".join(extra)
    live_key = LIVE + (" AND review_state IS NULL" if extra else "")
    return f"""
DROP INDEX ix_memories_visible_scan;
CREATE INDEX ix_memories_visible_scan ON memories (tenant_id, space_id)
    INCLUDE (id, expires_at, read_requires, embedding, embedding_model{included}) WHERE {LIVE};
DROP INDEX ix_memories_visible_count;
CREATE INDEX ix_memories_visible_count ON memories (tenant_id, space_id)
    INCLUDE (expires_at, read_requires{included}) WHERE {LIVE};
DROP INDEX uq_memories_live_key;
CREATE UNIQUE INDEX uq_memories_live_key
    ON memories (tenant_id, space_id, subject, kind, key, read_requires) WHERE {live_key};
"""


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(COLUMNS)
    op.execute(REJECTIONS)
    op.execute(_actions("read", "write", "delete", "review"))
    op.execute(_indexes("", "review_state", "writer_id"))


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    # Proposals and tombstones have no place without the state: they go.
    op.execute("ALTER TABLE memories NO FORCE ROW LEVEL SECURITY")
    op.execute("DELETE FROM memories WHERE review_state IS NOT NULL")
    op.execute("ALTER TABLE memories FORCE ROW LEVEL SECURITY")
    op.execute("DELETE FROM casbin_rule WHERE ptype = 'p' AND v3 = 'review'")
    op.execute("DELETE FROM role_grants WHERE action = 'review'")
    op.execute(_actions("read", "write", "delete"))
    op.execute(_indexes())
    op.execute("DROP TABLE review_rejections")
    op.execute(
        "ALTER TABLE memories DROP CONSTRAINT ck_memories_confidence, "
        "DROP CONSTRAINT ck_memories_review_state, DROP COLUMN confidence, "
        "DROP COLUMN reviewed_at, DROP COLUMN reviewed_by, DROP COLUMN review_reason, "
        "DROP COLUMN review_state"
    )
