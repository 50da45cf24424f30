"""Tables. Every tenant-owned table leads its primary key with `tenant_id` (Citus-ready).

`signing_keys` is the one platform table: keys belong to the issuer, not to a tenant.
"""

from __future__ import annotations

import uuid
from datetime import date, datetime
from typing import Any

from pgvector.sqlalchemy import Vector
from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Date,
    DateTime,
    Double,
    ForeignKeyConstraint,
    Identity,
    Index,
    Integer,
    LargeBinary,
    PrimaryKeyConstraint,
    SmallInteger,
    Text,
    UniqueConstraint,
    false,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, REGCONFIG, TSVECTOR, UUID
from sqlalchemy.orm import Mapped, mapped_column

from service.db.base import Base

EMBEDDING_DIMENSIONS = 256
"""The schema's vector size. The service refuses to start with a model of another size."""

MEMORY_KINDS = ("fact", "preference", "decision", "episode", "summary", "document")
LIVE_ROW = "superseded_at IS NULL AND revoked_at IS NULL"
REVIEW_STATES = ("proposed", "rejected")
"""`memories.review_state` (migration 20261202_review_state): NULL is an ordinary row; a
proposal waits for a reviewer, a rejected one is a tombstone no read returns."""
LIVE_KEY_ROW = f"{LIVE_ROW} AND review_state IS NULL"
"""The live-key slot: a proposal neither holds nor takes its key's slot until approved."""


def _now() -> Any:
    return mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())


class Tenant(Base):
    """A tenant. `is_platform`: the one tenant whose `manage:tenant` holders administer all
    tenants. A disabled tenant's tokens stop on their next request; a retired one (deleted) keeps
    its row so its audit chain stays and its id is never reused (service/tenants/)."""

    __tablename__ = "tenants"
    __table_args__ = (
        Index(
            "uq_tenants_platform",
            "is_platform",
            unique=True,
            postgresql_where=text("is_platform"),
        ),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID, primary_key=True)
    name: Mapped[str] = mapped_column(Text, nullable=False)
    policy_version: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="1")
    created_at: Mapped[datetime] = _now()
    is_platform: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=false())
    disabled_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    retired_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    settings: Mapped[dict[str, Any]] = mapped_column(
        JSONB, nullable=False, server_default=text("'{}'::jsonb")
    )
    updated_at: Mapped[datetime] = _now()


class Principal(Base):
    """A user, agent or service inside a tenant. `external_subject` maps an external IdP's `sub`."""

    __tablename__ = "principals"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "id"),
        ForeignKeyConstraint(["tenant_id"], ["tenants.tenant_id"], ondelete="CASCADE"),
        CheckConstraint("kind IN ('user', 'agent', 'service')", name="kind"),
        Index(
            "uq_principals_external",
            "tenant_id",
            "external_issuer",
            "external_subject",
            unique=True,
            postgresql_where=text("external_subject IS NOT NULL"),
        ),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID)
    id: Mapped[uuid.UUID] = mapped_column(UUID)
    kind: Mapped[str] = mapped_column(Text, nullable=False)
    display_name: Mapped[str] = mapped_column(Text, nullable=False)
    external_issuer: Mapped[str | None] = mapped_column(Text)
    external_subject: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = _now()
    disabled_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class Client(Base):
    """An OAuth client of the embedded issuer. Each serves exactly one principal (its `sub`)."""

    __tablename__ = "clients"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "client_id"),
        UniqueConstraint("client_id"),
        ForeignKeyConstraint(
            ["tenant_id", "principal_id"], ["principals.tenant_id", "principals.id"]
        ),
        CheckConstraint("kind IN ('agent', 'admin')", name="kind"),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID)
    client_id: Mapped[uuid.UUID] = mapped_column(UUID)
    principal_id: Mapped[uuid.UUID] = mapped_column(UUID, nullable=False)
    kind: Mapped[str] = mapped_column(Text, nullable=False)
    name: Mapped[str] = mapped_column(Text, nullable=False)
    secret_hash: Mapped[str] = mapped_column(Text, nullable=False)
    allowed_scopes: Mapped[list[str]] = mapped_column(ARRAY(Text), nullable=False)
    created_at: Mapped[datetime] = _now()
    disabled_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class SigningKey(Base):
    """Embedded issuer keys: `next` is published before use, `active` signs, `retired` verifies."""

    __tablename__ = "signing_keys"
    __table_args__ = (
        CheckConstraint("state IN ('next', 'active', 'retired')", name="state"),
        Index(
            "uq_signing_keys_one_active",
            "state",
            unique=True,
            postgresql_where=text("state = 'active'"),
        ),
    )

    kid: Mapped[str] = mapped_column(Text, primary_key=True)
    alg: Mapped[str] = mapped_column(Text, nullable=False)
    state: Mapped[str] = mapped_column(Text, nullable=False)
    public_jwk: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False)
    private_key_encrypted: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    created_at: Mapped[datetime] = _now()
    activated_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    retired_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class Space(Base):
    """The unit of access: a personal space per principal, team and tenant-wide spaces."""

    __tablename__ = "spaces"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "id"),
        ForeignKeyConstraint(["tenant_id"], ["tenants.tenant_id"], ondelete="CASCADE"),
        ForeignKeyConstraint(["tenant_id", "parent_id"], ["spaces.tenant_id", "spaces.id"]),
        CheckConstraint("kind IN ('personal', 'team', 'tenant')", name="kind"),
        Index(
            "uq_spaces_personal_owner",
            "tenant_id",
            "owner_id",
            unique=True,
            postgresql_where=text("kind = 'personal'"),
        ),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID)
    id: Mapped[uuid.UUID] = mapped_column(UUID)
    kind: Mapped[str] = mapped_column(Text, nullable=False)
    name: Mapped[str] = mapped_column(Text, nullable=False)
    owner_id: Mapped[uuid.UUID | None] = mapped_column(UUID)
    parent_id: Mapped[uuid.UUID | None] = mapped_column(UUID)
    created_at: Mapped[datetime] = _now()
    # The space's gates (service/policy/space_settings.py); {} = the defaults.
    settings: Mapped[dict[str, Any]] = mapped_column(
        JSONB, nullable=False, server_default=text("'{}'::jsonb")
    )


class Memory(Base):
    """One memory with every lifecycle column of docs/design.md (later issues add behaviour, not
    columns). Reads go through `service.policy.visible` only."""

    __tablename__ = "memories"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "id"),
        ForeignKeyConstraint(["tenant_id", "space_id"], ["spaces.tenant_id", "spaces.id"]),
        CheckConstraint(
            "kind IN ('fact', 'preference', 'decision', 'episode', 'summary', 'document')",
            name="kind",
        ),
        # Exact pre-filtered search reads this covering index only (docs/design.md, "Search"): a
        # tenant's live vectors sit together, so the scan costs ~1 µs per visible row.
        Index(
            "ix_memories_visible_scan",
            "tenant_id",
            "space_id",
            # `embedding_model`: the vector leg ranks only rows of the query's model
            # (embeddings.reembed, docs/jobs.md), still from this index alone.
            postgresql_include=[
                "id",
                "expires_at",
                "read_requires",
                "embedding",
                "embedding_model",
                # The review clause of Visible (migration 20261202_review_state), so the scan
                # stays index-only.
                "review_state",
                "writer_id",
            ],
            postgresql_where=text(LIVE_ROW),
        ),
        # Sizing a visible set (the search path choice, counts) without reading its vectors.
        Index(
            "ix_memories_visible_count",
            "tenant_id",
            "space_id",
            postgresql_include=["expires_at", "read_requires", "review_state", "writer_id"],
            postgresql_where=text(LIVE_ROW),
        ),
        # At most one live memory per (space, subject, kind, key, audience): supersession's
        # invariant. Rows with different `read_requires` never supersede each other.
        Index(
            "uq_memories_live_key",
            "tenant_id",
            "space_id",
            "subject",
            "kind",
            "key",
            "read_requires",
            unique=True,
            postgresql_where=text(LIVE_KEY_ROW),
        ),
        # The lexical leg of a search (migration 20261201_hybrid_recall): led by the tenant
        # (btree_gin), so a search never reads another tenant's postings, and live rows only.
        Index(
            "ix_memories_lexical",
            "tenant_id",
            "lexical",
            postgresql_using="gin",
            postgresql_where=text(LIVE_ROW),
        ),
        # The expiry sweep (migration 20261201_job_runs): rows past their time, read directly,
        # never by listing the tenant's memories.
        Index(
            "ix_memories_expiry",
            "tenant_id",
            "expires_at",
            postgresql_where=text("expires_at IS NOT NULL"),
        ),
        # Revocation's walk to derived rows (migration 20261202_revocation).
        Index("ix_memories_derived_from", "derived_from", postgresql_using="gin"),
        # The approximate search path (migration 20261130_ann_index): used only past
        # MEMGATE_SEARCH_EXACT_MAX_ROWS visible rows, with pgvector's iterative scan.
        Index(
            "ix_memories_embedding_hnsw",
            "embedding",
            postgresql_using="hnsw",
            postgresql_with={"m": 16, "ef_construction": 64},
            postgresql_ops={"embedding": "vector_cosine_ops"},
            postgresql_where=text(LIVE_ROW),
        ),
        CheckConstraint(
            "review_state IS NULL OR review_state IN ('proposed', 'rejected')",
            name="review_state",
        ),
        CheckConstraint("confidence >= 0 AND confidence <= 1", name="confidence"),
        # A sealed row (crypto-shredding, migration 20261204_crypto_shredding) names its key
        # and keeps no text in `value`.
        CheckConstraint(
            "(value_sealed IS NULL) = (value_key IS NULL) AND (value_sealed IS NULL OR value = '')",
            name="sealed",
        ),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID)
    id: Mapped[uuid.UUID] = mapped_column(UUID)
    space_id: Mapped[uuid.UUID] = mapped_column(UUID, nullable=False)
    owner_id: Mapped[uuid.UUID] = mapped_column(UUID, nullable=False)
    writer_id: Mapped[uuid.UUID] = mapped_column(UUID, nullable=False)
    client_id: Mapped[str] = mapped_column(Text, nullable=False)
    act: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    subject: Mapped[str] = mapped_column(Text, nullable=False)
    kind: Mapped[str] = mapped_column(Text, nullable=False)
    key: Mapped[str] = mapped_column(Text, nullable=False)
    value: Mapped[str] = mapped_column(Text, nullable=False)
    """The text; "" on a sealed row, whose text is `value_sealed` (service/shredding)."""
    value_sealed: Mapped[bytes | None] = mapped_column(LargeBinary)
    """A crypto-shredding tenant's text: nonce + AES-256-GCM ciphertext under the owner's data
    key, which lives outside PostgreSQL. NULL: the text is `value`."""
    value_key: Mapped[uuid.UUID | None] = mapped_column(UUID)
    """The id of the data key `value_sealed` is sealed under."""
    content_hash: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    # Deferred: reads never need the vector back, and parsing 256 floats per row is not free.
    embedding: Mapped[Any] = mapped_column(
        Vector(EMBEDDING_DIMENSIONS), nullable=True, deferred=True
    )
    """NULL only on a retracted stub (which no search reads: stubs are closed)."""
    embedding_model: Mapped[str] = mapped_column(Text, nullable=False)
    # The tenant's `text_search_config` when the row was written: its lexemes were made with
    # it, and stay so when the tenant changes language (docs/recall.md).
    lexical_config: Mapped[str] = mapped_column(
        REGCONFIG, nullable=False, server_default=text("'simple'::regconfig")
    )
    # Made from the text at write time: by the trigger `memories_lexical` from `value`, or, for
    # a sealed row, by the insert from the plaintext (migration 20261204_crypto_shredding).
    lexical: Mapped[Any] = mapped_column(TSVECTOR, deferred=True)
    valid_from: Mapped[datetime] = _now()
    valid_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    recorded_at: Mapped[datetime] = _now()
    superseded_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    superseded_by: Mapped[uuid.UUID | None] = mapped_column(UUID)
    supersedes: Mapped[uuid.UUID | None] = mapped_column(UUID)
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    retracted_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    """Set by DELETE: the row is a content-free stub that keeps its number and links."""
    derived_from: Mapped[list[uuid.UUID]] = mapped_column(
        ARRAY(UUID), nullable=False, server_default="{}"
    )
    read_requires: Mapped[list[uuid.UUID]] = mapped_column(
        ARRAY(UUID), nullable=False, server_default="{}"
    )
    source: Mapped[str | None] = mapped_column(Text)
    metadata_: Mapped[dict[str, Any]] = mapped_column(
        "metadata", JSONB, nullable=False, server_default="{}"
    )
    version: Mapped[int] = mapped_column(Integer, nullable=False, server_default="1")
    # The review state (docs/concepts.md, "Review"): NULL = ordinary; `proposed` = visible to
    # its writer and the space's reviewers only (version 0 until approved); `rejected` = a
    # tombstone no read returns. The reason, reviewer and time of the decision stay on the row.
    review_state: Mapped[str | None] = mapped_column(Text)
    review_reason: Mapped[str | None] = mapped_column(Text)
    reviewed_by: Mapped[uuid.UUID | None] = mapped_column(UUID)
    reviewed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    confidence: Mapped[float | None] = mapped_column(Double)
    """How sure the writer was (0..1), as it said; recorded and returned, never ranked on."""


class MemoryRecall(Base):
    """The day a memory was last returned by a search or a get (service/memory/recalls.py):
    what `memory.age_unused` compares with `max_unused_days`. Ids and dates only, no content;
    kept apart from `memories` so that noting a recall never rewrites a memory row."""

    __tablename__ = "memory_recalls"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "memory_id"),
        ForeignKeyConstraint(["tenant_id"], ["tenants.tenant_id"], ondelete="CASCADE"),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID)
    memory_id: Mapped[uuid.UUID] = mapped_column(UUID)
    recalled_on: Mapped[date] = mapped_column(Date, nullable=False)


class ReviewRejection(Base):
    """A reviewer's rejection of a proposal (service/memory/review.py): the normalized text's
    hash per space, so the same claim cannot be proposed there again by a non-reviewer. A hash
    and ids only, no content; the reason stays on the rejected memory row."""

    __tablename__ = "review_rejections"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "space_id", "text_hash"),
        ForeignKeyConstraint(
            ["tenant_id", "space_id"], ["spaces.tenant_id", "spaces.id"], ondelete="CASCADE"
        ),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID)
    space_id: Mapped[uuid.UUID] = mapped_column(UUID)
    text_hash: Mapped[bytes] = mapped_column(LargeBinary)
    memory_id: Mapped[uuid.UUID] = mapped_column(UUID, nullable=False)
    rejected_at: Mapped[datetime] = _now()


class Revocation(Base):
    """A revocation of one memory (service/revocation): its space and content hash (what a
    re-written claim is looked up by while it stands), the reason (content-like: kept here,
    never in an audit row), who revoked it and when; `reinstated_*` once lifted."""

    __tablename__ = "revocations"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "id"),
        ForeignKeyConstraint(["tenant_id"], ["tenants.tenant_id"], ondelete="CASCADE"),
        Index(
            "uq_revocations_standing",
            "tenant_id",
            "memory_id",
            unique=True,
            postgresql_where=text("reinstated_at IS NULL"),
        ),
        Index(
            "ix_revocations_content",
            "tenant_id",
            "space_id",
            "content_hash",
            postgresql_where=text("reinstated_at IS NULL"),
        ),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID)
    id: Mapped[uuid.UUID] = mapped_column(UUID)
    memory_id: Mapped[uuid.UUID] = mapped_column(UUID, nullable=False)
    space_id: Mapped[uuid.UUID] = mapped_column(UUID, nullable=False)
    content_hash: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    reason: Mapped[str] = mapped_column(Text, nullable=False)
    revoked_by: Mapped[uuid.UUID] = mapped_column(UUID, nullable=False)
    revoked_at: Mapped[datetime] = _now()
    reinstated_by: Mapped[uuid.UUID | None] = mapped_column(UUID)
    reinstated_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    reinstate_reason: Mapped[str | None] = mapped_column(Text)


class MemoryHiding(Base):
    """Why a memory is hidden: one row per standing revocation that hides it. A memory has
    `revoked_at` set exactly while it has one (migration 20261202_revocation)."""

    __tablename__ = "memory_hidings"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "memory_id", "revocation_id"),
        ForeignKeyConstraint(["tenant_id"], ["tenants.tenant_id"], ondelete="CASCADE"),
        Index("ix_memory_hidings_revocation", "tenant_id", "revocation_id"),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID)
    memory_id: Mapped[uuid.UUID] = mapped_column(UUID)
    revocation_id: Mapped[uuid.UUID] = mapped_column(UUID)


__all__ = [
    "EMBEDDING_DIMENSIONS",
    "LIVE_KEY_ROW",
    "LIVE_ROW",
    "MEMORY_KINDS",
    "Client",
    "Memory",
    "MemoryHiding",
    "MemoryRecall",
    "Principal",
    "Revocation",
    "SigningKey",
    "Space",
    "Tenant",
]


class AuditEvent(Base):
    """One row per call, appended only through the `audit_append()` function (see the migration
    `audit_log`): it takes the tenant's lock, numbers the row and chains its hash. Monthly range
    partitions on `at`; the append function guarantees `(tenant_id, seq)` is unique."""

    __tablename__ = "audit_events"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "seq", "at"),
        CheckConstraint(
            "coalesce(array_ndims(delegation), 1) = 1 "
            "AND coalesce(array_lower(delegation, 1), 1) = 1 "
            "AND coalesce(array_ndims(scopes), 1) = 1 AND coalesce(array_lower(scopes, 1), 1) = 1 "
            "AND coalesce(array_ndims(target_ids), 1) = 1 "
            "AND coalesce(array_lower(target_ids, 1), 1) = 1",
            name="flat_arrays",
        ),
        {"postgresql_partition_by": "RANGE (at)"},
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID)
    seq: Mapped[int] = mapped_column(BigInteger)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    request_id: Mapped[str] = mapped_column(Text, nullable=False)
    trace_id: Mapped[str | None] = mapped_column(Text)
    actor: Mapped[str | None] = mapped_column(Text)
    client_id: Mapped[str | None] = mapped_column(Text)
    delegation: Mapped[list[str]] = mapped_column(ARRAY(Text), nullable=False)
    token_id: Mapped[str | None] = mapped_column(Text)
    issuer: Mapped[str | None] = mapped_column(Text)
    scopes: Mapped[list[str]] = mapped_column(ARRAY(Text), nullable=False)
    method: Mapped[str] = mapped_column(Text, nullable=False)
    route: Mapped[str] = mapped_column(Text, nullable=False)
    action: Mapped[str] = mapped_column(Text, nullable=False)
    target_ids: Mapped[list[uuid.UUID]] = mapped_column(ARRAY(UUID), nullable=False)
    result_count: Mapped[int | None] = mapped_column(Integer)
    decision: Mapped[str] = mapped_column(Text, nullable=False)
    reason: Mapped[str] = mapped_column(Text, nullable=False)
    status: Mapped[int] = mapped_column(Integer, nullable=False)
    latency_us: Mapped[int] = mapped_column(BigInteger, nullable=False)
    policy_version: Mapped[int | None] = mapped_column(BigInteger)
    prev_hash: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    row_hash: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)


class AuditHead(Base):
    """The last appended row of each tenant's chain (written only by `audit_append()`)."""

    __tablename__ = "audit_heads"

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID, primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger, nullable=False)
    row_hash: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)


class AuditCheckpoint(Base):
    """A signed statement "tenant T's chain had hash H at seq N at time t" (a compact JWS made
    with an audit signing key). Append-only like the events."""

    __tablename__ = "audit_checkpoints"
    __table_args__ = (PrimaryKeyConstraint("tenant_id", "seq"),)

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID)
    seq: Mapped[int] = mapped_column(BigInteger)
    row_hash: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    signed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    kid: Mapped[str] = mapped_column(Text, nullable=False)
    jws: Mapped[str] = mapped_column(Text, nullable=False)


class AuditSigningKey(Base):
    """Platform keys that sign audit checkpoints; never used for tokens. Private half sealed with
    the key-encryption key like the token keys."""

    __tablename__ = "audit_signing_keys"

    kid: Mapped[str] = mapped_column(Text, primary_key=True)
    public_jwk: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False)
    private_key_encrypted: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    created_at: Mapped[datetime] = _now()
    retired_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class AuditPseudonymKey(Base):
    """Per-tenant HMAC key that turns subjects into audit pseudonyms (sealed with the KEK)."""

    __tablename__ = "audit_pseudonym_keys"

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID, primary_key=True)
    key_encrypted: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    created_at: Mapped[datetime] = _now()


class AuditActor(Base):
    """Pseudonym → subject: an ordinary table, so erasing a subject deletes its row here and the
    audit log keeps only a pseudonym nobody can resolve any more."""

    __tablename__ = "audit_actors"
    __table_args__ = (PrimaryKeyConstraint("tenant_id", "pseudonym"),)

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID)
    pseudonym: Mapped[str] = mapped_column(Text)
    subject: Mapped[str] = mapped_column(Text, nullable=False)
    principal_id: Mapped[uuid.UUID | None] = mapped_column(UUID)
    first_seen_at: Mapped[datetime] = _now()


class CasbinRule(Base):
    """One line of the tenant's Casbin policy (`p`, `g` or `g2`), in the adapters' column
    layout. Written only through the policy service, which rebuilds the compiled grants
    (`principal_roles`, `role_grants`) in the same transaction."""

    __tablename__ = "casbin_rule"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "id"),
        ForeignKeyConstraint(["tenant_id"], ["tenants.tenant_id"], ondelete="CASCADE"),
        CheckConstraint(
            "(ptype = 'p' AND v1 = tenant_id::text "
            "AND v3 IN ('read', 'write', 'delete', 'review')) "
            "OR (ptype IN ('g', 'g2') AND v2 = tenant_id::text AND v3 IS NULL)",
            name="shape",
        ),
        Index(
            "uq_casbin_rule_line",
            "tenant_id",
            "ptype",
            "v0",
            "v1",
            "v2",
            text("coalesce(v3, '')"),
            unique=True,
        ),
        Index("ix_casbin_rule_tenant_id_ptype_v0", "tenant_id", "ptype", "v0"),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID)
    id: Mapped[int] = mapped_column(BigInteger, Identity())
    ptype: Mapped[str] = mapped_column(Text, nullable=False)
    v0: Mapped[str] = mapped_column(Text, nullable=False)
    v1: Mapped[str] = mapped_column(Text, nullable=False)
    v2: Mapped[str] = mapped_column(Text, nullable=False)
    v3: Mapped[str | None] = mapped_column(Text)
    v4: Mapped[str | None] = mapped_column(Text)
    v5: Mapped[str | None] = mapped_column(Text)


class PrincipalRole(Base):
    """Compiled from `g` rules: principal P reaches `role` (a team, a role, or its own name)."""

    __tablename__ = "principal_roles"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "principal_id", "role"),
        Index("ix_principal_roles_tenant_id_role", "tenant_id", "role"),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID)
    principal_id: Mapped[uuid.UUID] = mapped_column(UUID)
    role: Mapped[str] = mapped_column(Text)


class RoleGrant(Base):
    """Compiled from `p` and `g2` rules: whoever reaches `role` may `action` in space S (the
    rule's space and every sub-space under it)."""

    __tablename__ = "role_grants"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "role", "action", "space_id"),
        CheckConstraint("action IN ('read', 'write', 'delete', 'review')", name="action"),
        Index("ix_role_grants_tenant_id_space_id_action", "tenant_id", "space_id", "action"),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID)
    role: Mapped[str] = mapped_column(Text)
    action: Mapped[str] = mapped_column(Text)
    space_id: Mapped[uuid.UUID] = mapped_column(UUID)


class SpaceGrant(Base):
    """A VIEW (migration 20261130_grant_closures): principal P may `action` in space S, the join
    of `principal_roles` and `role_grants`. Requests read this (in their own snapshot), never
    the rules; nothing writes it."""

    __tablename__ = "space_grants"
    __table_args__ = {"info": {"is_view": True}}

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID, primary_key=True)
    principal_id: Mapped[uuid.UUID] = mapped_column(UUID, primary_key=True)
    action: Mapped[str] = mapped_column(Text, primary_key=True)
    space_id: Mapped[uuid.UUID] = mapped_column(UUID, primary_key=True)


class Team(Base):
    """A named group of principals; membership is a `g` rule (`g, user:<id>, team:<id>, t`)."""

    __tablename__ = "teams"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "id"),
        ForeignKeyConstraint(["tenant_id"], ["tenants.tenant_id"], ondelete="CASCADE"),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID)
    id: Mapped[uuid.UUID] = mapped_column(UUID)
    name: Mapped[str] = mapped_column(Text, nullable=False)
    created_at: Mapped[datetime] = _now()


class Delegation(Base):
    """A user's consent that an agent may act for it (RFC 8693 token exchange)."""

    __tablename__ = "delegations"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "user_id", "agent_id"),
        ForeignKeyConstraint(
            ["tenant_id", "user_id"], ["principals.tenant_id", "principals.id"], ondelete="CASCADE"
        ),
        ForeignKeyConstraint(
            ["tenant_id", "agent_id"], ["principals.tenant_id", "principals.id"], ondelete="CASCADE"
        ),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID)
    user_id: Mapped[uuid.UUID] = mapped_column(UUID)
    agent_id: Mapped[uuid.UUID] = mapped_column(UUID)
    created_at: Mapped[datetime] = _now()


class TenantIssuer(Base):
    """An external identity provider a tenant registered for its own users and agents. The pair
    (issuer, audience) is unique across the platform: a token's `iss` and `aud` select exactly
    one tenant, whatever the token's claims say; and a tenant registers an `iss` once."""

    __tablename__ = "tenant_issuers"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "id"),
        UniqueConstraint("issuer", "audience"),
        # One registration per `iss` in a tenant: principals map to an issuer by `iss` alone,
        # so a second one (its own JWKS) would speak for the first one's principals.
        UniqueConstraint("tenant_id", "issuer"),
        ForeignKeyConstraint(["tenant_id"], ["tenants.tenant_id"], ondelete="CASCADE"),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID)
    id: Mapped[uuid.UUID] = mapped_column(UUID)
    issuer: Mapped[str] = mapped_column(Text, nullable=False)
    audience: Mapped[str] = mapped_column(Text, nullable=False)
    jwks_url: Mapped[str] = mapped_column(Text, nullable=False)
    algorithms: Mapped[list[str]] = mapped_column(ARRAY(Text), nullable=False)
    require_typ: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=text("true"))
    subject_claim: Mapped[str] = mapped_column(Text, nullable=False, server_default="sub")
    scope_claim: Mapped[str] = mapped_column(Text, nullable=False, server_default="scope")
    client_id_claim: Mapped[str] = mapped_column(Text, nullable=False, server_default="client_id")
    created_at: Mapped[datetime] = _now()


class TenantLimit(Base):
    """Configured quotas of a tenant (`client_id` '') or of one of its clients
    (service/quotas/schemas.py `Limits`, as JSON)."""

    __tablename__ = "tenant_limits"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "client_id"),
        ForeignKeyConstraint(["tenant_id"], ["tenants.tenant_id"], ondelete="CASCADE"),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID)
    client_id: Mapped[str] = mapped_column(Text)
    limits: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False)
    updated_at: Mapped[datetime] = _now()


class QuotaBucket(Base):
    """The shared state of one token bucket; replicas lease batches from it."""

    __tablename__ = "quota_buckets"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "client_id", "kind"),
        ForeignKeyConstraint(["tenant_id"], ["tenants.tenant_id"], ondelete="CASCADE"),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID)
    client_id: Mapped[str] = mapped_column(Text)
    kind: Mapped[str] = mapped_column(Text)
    tokens: Mapped[float] = mapped_column(Double, nullable=False)
    last_grant: Mapped[int] = mapped_column(Integer, nullable=False)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)


class QuotaSlot(Base):
    """Concurrent-request slots one replica holds, until `expires_at`."""

    __tablename__ = "quota_slots"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "client_id", "replica"),
        ForeignKeyConstraint(["tenant_id"], ["tenants.tenant_id"], ondelete="CASCADE"),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID)
    client_id: Mapped[str] = mapped_column(Text)
    replica: Mapped[uuid.UUID] = mapped_column(UUID)
    held: Mapped[int] = mapped_column(Integer, nullable=False)
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)


class TenantUsage(Base):
    """Stored memories (every version) and their bytes, one stripe of a tenant's count (kept
    by a trigger)."""

    __tablename__ = "tenant_usage"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "stripe"),
        ForeignKeyConstraint(["tenant_id"], ["tenants.tenant_id"], ondelete="CASCADE"),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID)
    stripe: Mapped[int] = mapped_column(SmallInteger)
    # Not named `memories`: the test harness takes that word after FROM-like syntax for the table.
    stored_count: Mapped[int] = mapped_column(BigInteger, nullable=False)
    stored_bytes: Mapped[int] = mapped_column(BigInteger, nullable=False)


class JobRun(Base):
    """One run of a job in a tenant (service/jobs/runner.py): what it covers, where it stands,
    why it stopped (a problem slug, never content), and the grants its principal held when it
    was enqueued (`granted`, by action), which every batch intersects with the grants now."""

    __tablename__ = "job_runs"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "id"),
        ForeignKeyConstraint(["tenant_id"], ["tenants.tenant_id"], ondelete="CASCADE"),
        CheckConstraint(
            "status IN ('queued', 'running', 'finished', 'failed', 'refused')", name="status"
        ),
        Index(
            "ix_job_runs_pending",
            "status",
            "heartbeat_at",
            postgresql_where=text("status IN ('queued', 'running')"),
        ),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID)
    id: Mapped[uuid.UUID] = mapped_column(UUID)
    job: Mapped[str] = mapped_column(Text, nullable=False)
    space_id: Mapped[uuid.UUID | None] = mapped_column(UUID)
    dry_run: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=false())
    options: Mapped[dict[str, Any]] = mapped_column(
        JSONB, nullable=False, server_default=text("'{}'::jsonb")
    )
    status: Mapped[str] = mapped_column(Text, nullable=False, server_default="queued")
    cursor: Mapped[str | None] = mapped_column(Text)
    counts: Mapped[dict[str, Any]] = mapped_column(
        JSONB, nullable=False, server_default=text("'{}'::jsonb")
    )
    batches: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    failures: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    """Batches of the run that failed in a row (an error, not a refusal); reset by success."""
    error_slug: Mapped[str | None] = mapped_column(Text)
    error_detail: Mapped[str | None] = mapped_column(Text)
    enqueued_by: Mapped[uuid.UUID | None] = mapped_column(UUID)
    principal_id: Mapped[uuid.UUID] = mapped_column(UUID, nullable=False)
    granted: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False)
    enqueued_at: Mapped[datetime] = _now()
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class IdempotencyKey(Base):
    """The answer a batch write gave under an `Idempotency-Key` (service/memory/idempotency.py),
    kept until `expires_at` for a replay. `answer` is dropped (NULL) when one of the memories it
    names is deleted, retracted or revoked (a trigger: migration 20261202_idempotency_keys)."""

    __tablename__ = "idempotency_keys"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "principal_id", "client_id", "key"),
        ForeignKeyConstraint(["tenant_id"], ["tenants.tenant_id"], ondelete="CASCADE"),
        Index("ix_idempotency_keys_expiry", "tenant_id", "expires_at"),
        Index("ix_idempotency_keys_memory_ids", "memory_ids", postgresql_using="gin"),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID)
    principal_id: Mapped[uuid.UUID] = mapped_column(UUID)
    client_id: Mapped[str] = mapped_column(Text)
    key: Mapped[str] = mapped_column(Text)
    request_hash: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    status: Mapped[int] = mapped_column(Integer, nullable=False)
    answer: Mapped[bytes | None] = mapped_column(LargeBinary)
    memory_ids: Mapped[list[uuid.UUID]] = mapped_column(
        ARRAY(UUID), nullable=False, server_default=text("'{}'")
    )
    created_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)


class ErasurePlan(Base):
    """An erasure (service/erasure): planned with its criteria and a fingerprint of what it
    reaches; once executed, the erased ids, counts per layer, the signed receipt and the
    proof's evidence, and its subjects replaced by audit pseudonyms, its names cleared
    (migration 20261203_erasure)."""

    __tablename__ = "erasure_plans"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "id"),
        ForeignKeyConstraint(["tenant_id"], ["tenants.tenant_id"], ondelete="CASCADE"),
        CheckConstraint("state IN ('planned', 'executed')", name="state"),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID)
    id: Mapped[uuid.UUID] = mapped_column(UUID)
    version: Mapped[int] = mapped_column(Integer, nullable=False, server_default="1")
    state: Mapped[str] = mapped_column(Text, nullable=False, server_default="planned")
    subjects: Mapped[list[str]] = mapped_column(
        ARRAY(Text), nullable=False, server_default=text("'{}'")
    )
    owners: Mapped[list[uuid.UUID]] = mapped_column(
        ARRAY(UUID), nullable=False, server_default=text("'{}'")
    )
    memory_ids: Mapped[list[uuid.UUID]] = mapped_column(
        ARRAY(UUID), nullable=False, server_default=text("'{}'")
    )
    names: Mapped[list[str]] = mapped_column(
        ARRAY(Text), nullable=False, server_default=text("'{}'")
    )
    name_count: Mapped[int] = mapped_column(Integer, nullable=False, server_default="0")
    keep_tombstones: Mapped[bool] = mapped_column(
        Boolean, nullable=False, server_default=text("true")
    )
    rewrite: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=text("true"))
    reason: Mapped[str] = mapped_column(Text, nullable=False)
    fingerprint: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    erased_tenant: Mapped[uuid.UUID | None] = mapped_column(UUID)
    """Set on a tenant's deletion (kept in the platform tenant): the tenant it erased."""
    planned_by: Mapped[uuid.UUID] = mapped_column(UUID, nullable=False)
    planned_at: Mapped[datetime] = _now()
    executed_by: Mapped[uuid.UUID | None] = mapped_column(UUID)
    executed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    erased: Mapped[list[uuid.UUID]] = mapped_column(
        ARRAY(UUID), nullable=False, server_default=text("'{}'")
    )
    counts: Mapped[dict[str, Any]] = mapped_column(
        JSONB, nullable=False, server_default=text("'{}'::jsonb")
    )
    receipt: Mapped[str | None] = mapped_column(Text)
    evidence: Mapped[dict[str, Any]] = mapped_column(
        JSONB, nullable=False, server_default=text("'{}'::jsonb")
    )


class ErasureTombstone(Base):
    """The content hash of an erased memory in its space: the same normalized text is not
    written there again (service/memory/service.py refuses it as `content-erased`)."""

    __tablename__ = "erasure_tombstones"
    __table_args__ = (
        PrimaryKeyConstraint("tenant_id", "space_id", "content_hash"),
        ForeignKeyConstraint(["tenant_id"], ["tenants.tenant_id"], ondelete="CASCADE"),
    )

    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID)
    space_id: Mapped[uuid.UUID] = mapped_column(UUID)
    content_hash: Mapped[bytes] = mapped_column(LargeBinary)
    erasure_id: Mapped[uuid.UUID] = mapped_column(UUID, nullable=False)
    erased_at: Mapped[datetime] = _now()
