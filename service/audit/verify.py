"""Verify a tenant's chain over a range of sequence numbers, inside the database.

Every row is checked on its own (its hash recomputed with `audit_canonical`), against its
predecessor (consecutive numbers, `prev_hash` = the previous `row_hash`), and the range against
the head and the signed checkpoints. The first failure wins; its sequence number is the first
one whose row is missing, altered, duplicated or out of chain.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from joserfc.jwk import KeySet
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncSession

from service.audit.checkpoints import key_set, public_keys, verify_signature
from service.db.models import AuditCheckpoint, AuditEvent, AuditHead, AuditSigningKey

GENESIS = bytes(32)
MAX_VERIFY_ROWS = 1_000_000
MAX_UNSIGNED_LISTED = 100
"""Unsigned checkpoints named in a report (the app role can insert any number of them)."""
MAX_BEYOND_CHECKED = 200
"""Checkpoints past the last row whose signature one verify call checks: each is a JWS check on
the event loop, and a million junk rows (planted before checkpoints went through
`audit_checkpoint_insert`) made every verify take ~30 s. One genuine row suffices to call the
tail cut."""

_FIRST_BAD = text(
    """
    WITH ranged AS (
        SELECT e.seq, e.prev_hash, e.row_hash,
               sha256(e.prev_hash || convert_to(audit_canonical(e), 'UTF8')) AS computed,
               lag(e.seq) OVER w AS before_seq,
               lag(e.row_hash) OVER w AS before_hash,
               -- What the canonical layout can encode (a superuser may drop the CHECK).
               coalesce(array_ndims(e.delegation), 1) = 1
                 AND coalesce(array_lower(e.delegation, 1), 1) = 1
                 AND coalesce(array_ndims(e.scopes), 1) = 1
                 AND coalesce(array_lower(e.scopes, 1), 1) = 1
                 AND coalesce(array_ndims(e.target_ids), 1) = 1
                 AND coalesce(array_lower(e.target_ids, 1), 1) = 1 AS flat,
               -- Fields audit_append() always fills. The layout encodes NULL as '-', so a row
               -- with one nulled and its hash recomputed would hash alike: it was never appended.
               e.prev_hash IS NOT NULL AND e.row_hash IS NOT NULL AND e.request_id IS NOT NULL
                 AND e.method IS NOT NULL AND e.route IS NOT NULL AND e.action IS NOT NULL
                 AND e.decision IS NOT NULL AND e.reason IS NOT NULL AND e.status IS NOT NULL
                 AND e.latency_us IS NOT NULL
                 AND e.delegation IS NOT NULL
                 AND NOT EXISTS (SELECT FROM unnest(e.delegation) x WHERE x IS NULL)
                 AND e.scopes IS NOT NULL
                 AND NOT EXISTS (SELECT FROM unnest(e.scopes) x WHERE x IS NULL)
                 AND e.target_ids IS NOT NULL
                 AND NOT EXISTS (SELECT FROM unnest(e.target_ids) x WHERE x IS NULL)
                 AS present
          FROM audit_events e
         WHERE e.tenant_id = :tenant_id AND e.seq BETWEEN :from_seq AND :to_seq
        WINDOW w AS (ORDER BY e.seq, e.at)
    ), judged AS (
        SELECT CASE
                 WHEN before_seq IS NULL AND seq <> :from_seq THEN :from_seq
                 WHEN before_seq IS NOT NULL AND seq > before_seq + 1 THEN before_seq + 1
                 ELSE seq
               END AS bad_seq,
               CASE
                 WHEN before_seq IS NULL AND seq <> :from_seq THEN 'missing_row'
                 WHEN before_seq IS NOT NULL AND seq = before_seq THEN 'duplicate_seq'
                 WHEN before_seq IS NOT NULL AND seq > before_seq + 1 THEN 'missing_row'
                 -- NULL-safe: a NULL hash compared with <> is not true, and passed as intact.
                 WHEN computed IS DISTINCT FROM row_hash OR NOT flat OR NOT present
                   THEN 'row_hash_mismatch'
                 WHEN prev_hash IS DISTINCT FROM coalesce(before_hash, :anchor)
                   THEN 'chain_broken'
               END AS reason
          FROM ranged
    )
    SELECT bad_seq, reason FROM judged WHERE reason IS NOT NULL
     ORDER BY bad_seq LIMIT 1
    """
)
_SUMMARY = text(
    "SELECT count(*), max(seq) FROM audit_events "
    "WHERE tenant_id = :tenant_id AND seq BETWEEN :from_seq AND :to_seq"
)


@dataclass(frozen=True)
class CheckpointCheck:
    seq: int
    row_hash: bytes
    jws: str
    signature_valid: bool
    matches_chain: bool


@dataclass(frozen=True)
class VerifyReport:
    from_seq: int
    to_seq: int
    checked: int
    first_bad_seq: int | None
    reason: str | None
    head_seq: int
    head_hash: bytes | None
    checkpoint: CheckpointCheck | None
    unsigned: list[int]
    """Seqs of stored checkpoints no audit key signed for this tenant and seq: they prove
    nothing, so they count for nothing (reported, never a cut or a mismatch)."""

    @property
    def ok(self) -> bool:
        return self.first_bad_seq is None


async def head(session: AsyncSession, tenant_id: uuid.UUID) -> tuple[int, bytes | None]:
    row = (
        await session.execute(
            select(AuditHead.seq, AuditHead.row_hash).where(AuditHead.tenant_id == tenant_id)
        )
    ).one_or_none()
    if row is None:
        return 0, None
    # A head a superuser nulled names no row: verify_range reports it as head_mismatch.
    return (int(row[0]) if row[0] is not None else 0), _bytes(row[1])


def _bytes(value: bytes | None) -> bytes | None:
    return bytes(value) if value is not None else None


async def _row_hash(session: AsyncSession, tenant_id: uuid.UUID, seq: int) -> bytes | None:
    found = await session.scalar(
        select(AuditEvent.row_hash).where(AuditEvent.tenant_id == tenant_id, AuditEvent.seq == seq)
    )
    return _bytes(found)


async def verify_range(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    from_seq: int,
    to_seq: int | None,
    known: tuple[int, bytes] | None = None,
) -> VerifyReport:
    """`known`: a (seq, hash) the caller holds from outside the database (a receipt or a
    checkpoint); the chain must still have that row with that hash, whatever the range."""
    head_seq, head_hash = await head(session, tenant_id)
    top = await session.scalar(
        select(func.max(AuditEvent.seq)).where(AuditEvent.tenant_id == tenant_id)
    )
    # Rows without a usable head (deleted, or nulled by a superuser): the newest row stands in so
    # the range still covers the chain, and the head itself is reported below.
    broken_head = top is not None and (head_seq == 0 or head_hash is None)
    if top is not None and broken_head:
        head_seq = max(head_seq, int(top))
    last = min(to_seq if to_seq is not None else head_seq, from_seq + MAX_VERIFY_ROWS - 1)
    anchor = GENESIS if from_seq == 1 else await _row_hash(session, tenant_id, from_seq - 1)
    params = {
        "tenant_id": tenant_id,
        "from_seq": from_seq,
        "to_seq": last,
        "anchor": anchor if anchor is not None else b"",
    }
    bad = (await session.execute(_FIRST_BAD, params)).one_or_none()
    checked, last_seen = (await session.execute(_SUMMARY, params)).one()
    first_bad, reason = (int(bad[0]), str(bad[1])) if bad else (None, None)
    if first_bad is None and last >= from_seq and (last_seen or 0) < min(last, head_seq):
        first_bad, reason = (last_seen or from_seq - 1) + 1, "missing_row"
    jwks = key_set(await public_keys(session))
    unsigned: list[int] = []
    if first_bad is None and last >= head_seq:  # the range reaches the end of the chain
        first_bad, reason = await _check_end(
            session, tenant_id, last_seen, head_seq, head_hash, jwks, unsigned
        )
    checkpoint = await _check_checkpoints(session, tenant_id, from_seq, last, jwks, unsigned)
    if (
        first_bad is None
        and checkpoint is not None
        and not (checkpoint.signature_valid and checkpoint.matches_chain)
    ):
        first_bad, reason = checkpoint.seq, "checkpoint_mismatch"
    if first_bad is None and known is not None:
        first_bad, reason = await _check_known(session, tenant_id, *known)
    if first_bad is None and broken_head:
        first_bad, reason = head_seq, "head_mismatch"
    return VerifyReport(
        from_seq=from_seq,
        to_seq=last,
        checked=int(checked),
        first_bad_seq=first_bad,
        reason=reason,
        head_seq=head_seq,
        head_hash=head_hash,
        checkpoint=checkpoint,
        unsigned=sorted(set(unsigned))[:MAX_UNSIGNED_LISTED],
    )


def _genuine(row: AuditCheckpoint, tenant_id: uuid.UUID, jwks: KeySet) -> bytes | None:
    """The hash a checkpoint row's JWS signs, when an audit key signed it for this tenant and
    this seq; None for anything else (junk, an unknown key, another tenant's or seq's JWS)."""
    payload = verify_signature(row.jws or "", jwks)
    if not payload or payload.get("tenant") != str(tenant_id) or payload.get("seq") != row.seq:
        return None
    return _signed_hash(payload) or None


async def _check_end(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    last_seen: int | None,
    head_seq: int,
    head_hash: bytes | None,
    jwks: KeySet,
    unsigned: list[int],
) -> tuple[int | None, str | None]:
    """The chain's end: rows must reach every signed checkpoint (a truncated tail, even with the
    head moved back, is missing rows) and the head must name the last row. Only checkpoints an
    audit key signed count: the highest row of any kind did, and one unsigned row the app could
    insert (and never delete) made a tenant's verify report a cut tail for ever."""
    last = last_seen or 0
    if last < head_seq:
        return last + 1, "missing_row"
    # Bounded work: rows under a kid no audit key has are unsigned without a signature check
    # (only as many as a report lists), and at most MAX_BEYOND_CHECKED others are checked.
    beyond = AuditCheckpoint.tenant_id == tenant_id, AuditCheckpoint.seq > last
    published = AuditCheckpoint.kid.in_(select(AuditSigningKey.kid))
    strangers = await session.scalars(
        select(AuditCheckpoint.seq)
        .where(*beyond, ~published)
        .order_by(AuditCheckpoint.seq)
        .limit(MAX_UNSIGNED_LISTED)
    )
    unsigned.extend(int(seq) for seq in strangers)
    candidates = await session.scalars(
        select(AuditCheckpoint)
        .where(*beyond, published)
        .order_by(AuditCheckpoint.seq)
        .limit(MAX_BEYOND_CHECKED)
    )
    cut = False
    for row in candidates:
        if _genuine(row, tenant_id, jwks) is None:
            unsigned.append(row.seq)
        else:
            cut = True
            break
    if cut:
        return last + 1, "missing_row"
    if head_seq and head_hash != await _row_hash(session, tenant_id, head_seq):
        return head_seq, "head_mismatch"
    return None, None


async def _check_known(
    session: AsyncSession, tenant_id: uuid.UUID, seq: int, row_hash: bytes
) -> tuple[int | None, str | None]:
    """A held head: a cut tail (with the head and the checkpoints moved back alike) lacks its
    row; a cut tail refilled by later calls has another row at its seq."""
    stored = await _row_hash(session, tenant_id, seq)
    if stored is None:
        top = await session.scalar(
            select(func.max(AuditEvent.seq)).where(AuditEvent.tenant_id == tenant_id)
        )
        return (int(top or 0) + 1 if (top or 0) < seq else seq), "missing_row"
    if stored != row_hash:
        return seq, "known_head_mismatch"
    return None, None


async def _check_checkpoints(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    from_seq: int,
    to_seq: int,
    jwks: KeySet,
    unsigned: list[int],
) -> CheckpointCheck | None:
    """Every signed checkpoint in the range must carry the hash the chain has at its seq (and
    the row's stored hash must be the signed one). Answers the first one that does not, else
    the latest one. Rows no audit key signed are listed in `unsigned` and judged no further."""
    rows = (
        await session.scalars(
            select(AuditCheckpoint)
            .where(
                AuditCheckpoint.tenant_id == tenant_id,
                AuditCheckpoint.seq.between(from_seq, to_seq),
            )
            .order_by(AuditCheckpoint.seq)
        )
    ).all()
    if not rows:
        return None
    stored = await session.execute(
        select(AuditEvent.seq, AuditEvent.row_hash).where(
            AuditEvent.tenant_id == tenant_id,
            AuditEvent.seq.in_([row.seq for row in rows]),
        )
    )
    chain = {int(seq): _bytes(row_hash) for seq, row_hash in stored.all()}
    result: CheckpointCheck | None = None
    for row in rows:
        signed_hash = _genuine(row, tenant_id, jwks)
        if signed_hash is None:
            unsigned.append(row.seq)
            continue
        in_chain = chain.get(row.seq)
        result = CheckpointCheck(
            seq=row.seq,
            row_hash=signed_hash,
            jws=row.jws or "",
            # A genuine JWS over another hash than the row's column: the column was edited.
            signature_valid=signed_hash == (_bytes(row.row_hash) or b""),
            matches_chain=in_chain is not None and in_chain == signed_hash,
        )
        if not (result.signature_valid and result.matches_chain):
            return result
    return result


def _signed_hash(payload: dict[str, Any] | None) -> bytes:
    """The hash a verified checkpoint payload names; empty when it names none (a key we hold
    signed it, so this is defensive, not a trust decision)."""
    value = payload.get("hash") if payload else None
    try:
        return bytes.fromhex(value) if isinstance(value, str) else b""
    except ValueError:
        return b""
