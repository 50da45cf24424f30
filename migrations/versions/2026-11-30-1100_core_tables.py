"""Core tables: tenants, principals, clients, signing keys, spaces, memories.

Memories carry every lifecycle column of docs/design.md ("Parts") so later issues add behaviour, not columns.

Revision ID: 20261130_core
Revises:
Create Date: 2026-11-30 11:02:51.976027
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from pgvector.sqlalchemy import Vector
from sqlalchemy.dialects import postgresql

revision: str = "20261130_core"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute("CREATE EXTENSION IF NOT EXISTS vector")
    op.create_table(
        "signing_keys",
        sa.Column("kid", sa.Text(), nullable=False),
        sa.Column("alg", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("public_jwk", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("private_key_encrypted", sa.LargeBinary(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("activated_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("retired_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "state IN ('next', 'active', 'retired')", name=op.f("ck_signing_keys_state")
        ),
        sa.PrimaryKeyConstraint("kid", name=op.f("pk_signing_keys")),
    )
    op.create_index(
        "uq_signing_keys_one_active",
        "signing_keys",
        ["state"],
        unique=True,
        postgresql_where=sa.text("state = 'active'"),
    )
    op.create_table(
        "tenants",
        sa.Column("tenant_id", sa.UUID(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("policy_version", sa.BigInteger(), server_default="1", nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("tenant_id", name=op.f("pk_tenants")),
    )
    op.create_table(
        "principals",
        sa.Column("tenant_id", sa.UUID(), nullable=False),
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("display_name", sa.Text(), nullable=False),
        sa.Column("external_issuer", sa.Text(), nullable=True),
        sa.Column("external_subject", sa.Text(), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("disabled_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("kind IN ('user', 'agent', 'service')", name=op.f("ck_principals_kind")),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.tenant_id"],
            name=op.f("fk_principals_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant_id", "id", name=op.f("pk_principals")),
    )
    op.create_index(
        "uq_principals_external",
        "principals",
        ["tenant_id", "external_issuer", "external_subject"],
        unique=True,
        postgresql_where=sa.text("external_subject IS NOT NULL"),
    )
    op.create_table(
        "spaces",
        sa.Column("tenant_id", sa.UUID(), nullable=False),
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("owner_id", sa.UUID(), nullable=True),
        sa.Column("parent_id", sa.UUID(), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint("kind IN ('personal', 'team', 'tenant')", name=op.f("ck_spaces_kind")),
        sa.ForeignKeyConstraint(
            ["tenant_id", "parent_id"],
            ["spaces.tenant_id", "spaces.id"],
            name=op.f("fk_spaces_tenant_id_parent_id_spaces"),
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.tenant_id"],
            name=op.f("fk_spaces_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant_id", "id", name=op.f("pk_spaces")),
    )
    op.create_index(
        "uq_spaces_personal_owner",
        "spaces",
        ["tenant_id", "owner_id"],
        unique=True,
        postgresql_where=sa.text("kind = 'personal'"),
    )
    op.create_table(
        "clients",
        sa.Column("tenant_id", sa.UUID(), nullable=False),
        sa.Column("client_id", sa.UUID(), nullable=False),
        sa.Column("principal_id", sa.UUID(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("secret_hash", sa.Text(), nullable=False),
        sa.Column("allowed_scopes", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("disabled_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("kind IN ('agent', 'admin')", name=op.f("ck_clients_kind")),
        sa.ForeignKeyConstraint(
            ["tenant_id", "principal_id"],
            ["principals.tenant_id", "principals.id"],
            name=op.f("fk_clients_tenant_id_principal_id_principals"),
        ),
        sa.PrimaryKeyConstraint("tenant_id", "client_id", name=op.f("pk_clients")),
        sa.UniqueConstraint("client_id", name=op.f("uq_clients_client_id")),
    )
    op.create_table(
        "memories",
        sa.Column("tenant_id", sa.UUID(), nullable=False),
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("space_id", sa.UUID(), nullable=False),
        sa.Column("owner_id", sa.UUID(), nullable=False),
        sa.Column("writer_id", sa.UUID(), nullable=False),
        sa.Column("client_id", sa.Text(), nullable=False),
        sa.Column("act", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("subject", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.Column("content_hash", sa.LargeBinary(), nullable=False),
        sa.Column("embedding", Vector(256), nullable=False),
        sa.Column("embedding_model", sa.Text(), nullable=False),
        sa.Column(
            "lexical",
            postgresql.TSVECTOR(),
            sa.Computed("to_tsvector('simple', value)", persisted=True),
            nullable=False,
        ),
        sa.Column(
            "valid_from",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("valid_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "recorded_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("superseded_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("superseded_by", sa.UUID(), nullable=True),
        sa.Column("supersedes", sa.UUID(), nullable=True),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("derived_from", postgresql.ARRAY(sa.UUID()), server_default="{}", nullable=False),
        sa.Column(
            "read_requires", postgresql.ARRAY(sa.UUID()), server_default="{}", nullable=False
        ),
        sa.Column("source", sa.Text(), nullable=True),
        sa.Column(
            "metadata", postgresql.JSONB(astext_type=sa.Text()), server_default="{}", nullable=False
        ),
        sa.Column("version", sa.Integer(), server_default="1", nullable=False),
        sa.CheckConstraint(
            "kind IN ('fact', 'preference', 'decision', 'episode', 'summary', 'document')",
            name=op.f("ck_memories_kind"),
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id", "space_id"],
            ["spaces.tenant_id", "spaces.id"],
            name=op.f("fk_memories_tenant_id_space_id_spaces"),
        ),
        sa.PrimaryKeyConstraint("tenant_id", "id", name=op.f("pk_memories")),
    )
    op.create_index(
        "ix_memories_lexical", "memories", ["lexical"], unique=False, postgresql_using="gin"
    )
    op.create_index(
        "ix_memories_visible_scan",
        "memories",
        ["tenant_id", "space_id"],
        unique=False,
        postgresql_include=["id", "expires_at", "read_requires", "embedding"],
        postgresql_where=sa.text("superseded_at IS NULL AND revoked_at IS NULL"),
    )
    op.create_index(
        "uq_memories_live_key",
        "memories",
        ["tenant_id", "space_id", "subject", "kind", "key"],
        unique=True,
        postgresql_where=sa.text("superseded_at IS NULL AND revoked_at IS NULL"),
    )


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.drop_index(
        "uq_memories_live_key",
        table_name="memories",
        postgresql_where=sa.text("superseded_at IS NULL AND revoked_at IS NULL"),
    )
    op.drop_index(
        "ix_memories_visible_scan",
        table_name="memories",
        postgresql_include=["id", "expires_at", "read_requires", "embedding"],
        postgresql_where=sa.text("superseded_at IS NULL AND revoked_at IS NULL"),
    )
    op.drop_index("ix_memories_lexical", table_name="memories", postgresql_using="gin")
    op.drop_table("memories")
    op.drop_table("clients")
    op.drop_index(
        "uq_spaces_personal_owner",
        table_name="spaces",
        postgresql_where=sa.text("kind = 'personal'"),
    )
    op.drop_table("spaces")
    op.drop_index(
        "uq_principals_external",
        table_name="principals",
        postgresql_where=sa.text("external_subject IS NOT NULL"),
    )
    op.drop_table("principals")
    op.drop_table("tenants")
    op.drop_index(
        "uq_signing_keys_one_active",
        table_name="signing_keys",
        postgresql_where=sa.text("state = 'active'"),
    )
    op.drop_table("signing_keys")
