"""Wire shapes of the audit API. Hashes are lowercase hex; times are RFC 3339 UTC."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Literal

import msgspec

Decision = Literal["allow", "deny", "error"]


class AuditEventOut(msgspec.Struct, kw_only=True):
    """One row as stored. Every field the append function fills is present on an intact row;
    a row a superuser edited may carry nulls anywhere (verify names it `row_hash_mismatch`)."""

    tenant_id: uuid.UUID
    seq: int
    at: datetime
    request_id: str
    trace_id: str | None
    actor: str | None
    """HMAC pseudonym of the token's subject (resolvable only through the erasable actor map)."""
    client_id: str | None
    delegation: list[str]
    token_id: str | None
    issuer: str | None
    scopes: list[str]
    method: str
    route: str
    action: str
    target_ids: list[uuid.UUID]
    result_count: int | None
    decision: Decision
    reason: str
    status: int
    latency_us: int
    policy_version: int | None
    prev_hash: str | None
    """Null only on an edited row (see above)."""
    row_hash: str | None
    """Null only on an edited row (see above)."""


class AuditPage(msgspec.Struct, kw_only=True):
    items: list[AuditEventOut]
    next_cursor: str | None


class CheckpointOut(msgspec.Struct, kw_only=True):
    tenant_id: uuid.UUID
    seq: int
    hash: str
    signed_at: datetime
    kid: str
    jws: str
    """Compact JWS (EdDSA) over the canonical JSON payload; verify with /v1/audit/keys."""


class CheckpointVerdict(msgspec.Struct, kw_only=True):
    seq: int
    hash: str
    jws: str
    signature_valid: bool
    matches_chain: bool


class VerifyOut(msgspec.Struct, kw_only=True):
    ok: bool
    from_seq: int
    to_seq: int
    checked: int
    first_bad_seq: int | None
    reason: str | None
    """missing_row | duplicate_seq | row_hash_mismatch | chain_broken | checkpoint_mismatch |
    head_mismatch | known_head_mismatch"""
    head_seq: int
    head_hash: str | None
    checkpoint: CheckpointVerdict | None
    """The first signed checkpoint in the range that failed, else the latest one in the range."""
    unsigned_checkpoints: list[int]
    """Seqs of stored checkpoints that no audit key signed for this tenant and seq (at most
    100): they prove nothing and count for nothing; a planted row is reported here."""
