"""Signed checkpoints: "tenant T's audit chain had hash H at seq N", signed with an audit key.

Audit keys are Ed25519 keys of their own (never the token keys): a leaked token key cannot forge
a checkpoint and rotating token keys does not touch them. A checkpoint is a compact JWS whose
payload is canonical JSON (sorted keys, no spaces). Tenants fetch checkpoints and keep them;
a later rewrite of the chain, even a consistent one, no longer matches what they hold.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

import structlog
from cryptography.exceptions import InvalidTag
from joserfc import jws
from joserfc.errors import JoseError
from joserfc.jwk import KeyParameters, KeySet, KeySetSerialization, OKPKey
from sqlalchemy import func, select, text, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.auth.keys import KeyEncryptionKey, WrongKeyEncryptionKey
from service.db.models import AuditCheckpoint, AuditHead, AuditSigningKey
from service.db.tenancy import name_tenant

CHECKPOINT_TYPE = "memgate-audit-checkpoint+jws"
PAYLOAD_VERSION = "memgate.audit.checkpoint.v1"
ALGORITHM = "Ed25519"
"""RFC 9864's fully specified name (the polymorphic `EdDSA` is deprecated)."""

_log = structlog.get_logger("memgate.audit")


@dataclass(frozen=True)
class CheckpointClaims:
    tenant_id: uuid.UUID
    seq: int
    row_hash: bytes
    signed_at: datetime

    def payload(self) -> bytes:
        body = {
            "v": PAYLOAD_VERSION,
            "tenant": str(self.tenant_id),
            "seq": self.seq,
            "hash": self.row_hash.hex(),
            "signed_at": self.signed_at.isoformat(),
        }
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


class NoAuditKey(Exception):
    """No unretired audit signing key this process can open: the owner makes one (`memgate
    migrate`, or `serve` with the owner's URL)."""

    def __str__(self) -> str:
        return "no usable audit signing key"


def _sealing_id(kid: str) -> str:
    return f"audit-signing:{kid}"


async def signing_key(session: AsyncSession, kek: KeyEncryptionKey) -> OKPKey | None:
    """The newest unretired audit key this process can unseal, or None when there is none.

    Keys are the owner's (`ensure_audit_key`); the app role only reads them. A row it cannot
    open (another key-encryption key, or a row put there by hand) is passed over, not trusted:
    the newest row used to decide, and one that could not be unsealed stopped every call that
    was due a checkpoint."""
    rows = await session.scalars(
        select(AuditSigningKey)
        .where(AuditSigningKey.retired_at.is_(None))
        .order_by(AuditSigningKey.created_at.desc())
    )
    for row in rows:
        try:
            private = json.loads(kek.open(_sealing_id(row.kid), row.private_key_encrypted))
            key = OKPKey.import_key(private)
        except (InvalidTag, ValueError, TypeError, JoseError):
            continue
        if key.is_private and key.kid == row.kid:
            return key
    return None


async def ensure_audit_key(session: AsyncSession, kek: KeyEncryptionKey) -> None:
    """As the owner: an unretired audit key this key-encryption key opens exists (first start,
    or after the keys were retired). The app role may not write audit keys (a key it planted
    was trusted), so `memgate migrate` and `serve` call this with an owner's session.

    Unretired keys that `kek` cannot open refuse (WrongKeyEncryptionKey) instead of getting a
    new key beside them: a migration run with another key used to add one its own pods could
    open, and the pods holding the first key lost theirs. `memgate keys rotate-audit` retires
    them on purpose."""
    # One key at a time: concurrent starts (several API pods) wait for each other here.
    await session.execute(
        text("SELECT pg_advisory_xact_lock(hashtextextended('memgate.audit.key', 0))")
    )
    if await signing_key(session, kek) is not None:
        return
    unretired = await session.scalar(
        select(func.count())
        .select_from(AuditSigningKey)
        .where(AuditSigningKey.retired_at.is_(None))
    )
    if unretired:
        raise WrongKeyEncryptionKey(f"the {unretired} unretired audit signing key(s)")
    kid = f"audit-{datetime.now(UTC):%Y%m%d}-{uuid.uuid4().hex[:8]}"
    params: KeyParameters = {"kid": kid, "alg": ALGORITHM, "use": "sig"}
    key = OKPKey.generate_key("Ed25519", parameters=params)
    session.add(
        AuditSigningKey(
            kid=kid,
            public_jwk=key.as_dict(private=False),
            private_key_encrypted=kek.seal(
                _sealing_id(kid), json.dumps(key.as_dict(private=True)).encode()
            ),
        )
    )
    await session.flush()


async def rotate_audit_key(session: AsyncSession, kek: KeyEncryptionKey) -> str:
    """As the owner: retire every unretired audit key and make a fresh one; returns its kid.
    Retired keys stay published, so the checkpoints they signed keep verifying."""
    await session.execute(
        text("SELECT pg_advisory_xact_lock(hashtextextended('memgate.audit.key', 0))")
    )
    await session.execute(
        update(AuditSigningKey)
        .where(AuditSigningKey.retired_at.is_(None))
        .values(retired_at=func.now())
    )
    await ensure_audit_key(session, kek)
    key = await signing_key(session, kek)
    if key is None:  # ensure_audit_key just made one this key-encryption key opens
        raise NoAuditKey
    return str(key.kid)


async def public_keys(session: AsyncSession) -> dict[str, Any]:
    """Every audit key ever used (retired ones still verify old checkpoints), as a JWKS."""
    rows = (
        await session.scalars(
            select(AuditSigningKey.public_jwk).order_by(AuditSigningKey.created_at)
        )
    ).all()
    return {"keys": list(rows)}


def sign(claims: CheckpointClaims, key: OKPKey) -> str:
    header = {"alg": ALGORITHM, "kid": key.kid, "typ": CHECKPOINT_TYPE}
    return jws.serialize_compact(header, claims.payload(), key, algorithms=[ALGORITHM])


def key_set(jwks: dict[str, Any]) -> KeySet:
    """`jwks` imported once per call: importing it again for every row cost more than the
    signature check itself when many rows were judged."""
    return KeySet.import_key_set(cast("KeySetSerialization", jwks))


def verify_signature(compact: str, jwks: dict[str, Any] | KeySet) -> dict[str, Any] | None:
    """The payload of a checkpoint JWS signed by one of `jwks`, or None."""
    try:
        keys = jwks if isinstance(jwks, KeySet) else key_set(jwks)
        verified = jws.deserialize_compact(compact, keys, algorithms=[ALGORITHM])
        payload: dict[str, Any] = json.loads(verified.payload)
    except (JoseError, ValueError):
        return None
    return payload


async def sign_due_checkpoints(session: AsyncSession, kek: KeyEncryptionKey) -> int:
    """A checkpoint for every chain that grew since its last one; returns how many were made.
    Also makes sure the coming months' audit partitions exist."""
    await session.execute(text("SELECT audit_ensure_partitions(2)"))
    # Due: every head without a checkpoint an audit key signed. (Not "above the highest
    # checkpoint": a row planted with a huge seq silenced the signer; and not "any row at the
    # head's seq": an unsigned one counted as signed.) One signature check per tenant at most.
    heads = (
        await session.execute(
            select(AuditHead.tenant_id, AuditHead.seq, AuditHead.row_hash, AuditCheckpoint.jws)
            .outerjoin(
                AuditCheckpoint,
                (AuditCheckpoint.tenant_id == AuditHead.tenant_id)
                & (AuditCheckpoint.seq == AuditHead.seq),
            )
            .where(AuditHead.seq > 0)
        )
    ).all()
    keys = key_set(await public_keys(session)) if any(h.jws for h in heads) else None
    due = [
        (tenant_id, int(seq), bytes(row_hash))
        for tenant_id, seq, row_hash, compact in heads
        if compact is None
        or keys is None
        or not signs(verify_signature(compact, keys), tenant_id, int(seq), bytes(row_hash))
    ]
    if not due:
        return 0
    key = await signing_key(session, kek)
    if key is None:
        raise NoAuditKey
    made = 0
    for tenant_id, seq, row_hash in due:
        # The app role inserts checkpoints only for the tenant the transaction names.
        await name_tenant(session, tenant_id)
        if await insert_checkpoint(session, key, tenant_id, seq, row_hash):
            made += 1
        else:
            # An unsigned row holds the head's seq (planted before checkpoints went through
            # audit_checkpoint_insert); append-only, it stays. The next head is signed.
            _log.warning("audit_checkpoint_seq_taken", tenant_id=str(tenant_id), seq=seq)
    return made


def signs(payload: dict[str, Any] | None, tenant_id: uuid.UUID, seq: int, row_hash: bytes) -> bool:
    """A verified checkpoint payload names exactly this tenant, seq and hash."""
    return payload is not None and (
        payload.get("tenant"),
        payload.get("seq"),
        payload.get("hash"),
    ) == (str(tenant_id), seq, row_hash.hex())


async def insert_checkpoint(
    session: AsyncSession, key: OKPKey, tenant_id: uuid.UUID, seq: int, row_hash: bytes
) -> bool:
    """Sign (tenant, seq, hash) and store it; False when a row is already there for that seq.

    Through the owner's `audit_checkpoint_insert`, the app role's only way to write a
    checkpoint: it refuses a row for a tenant the transaction does not name, a (seq, hash) that
    is not a row of that tenant's chain, and a kid that is not an audit key. A direct INSERT
    let a stolen login plant junk at any seq (latest hid the real checkpoints, the signer and
    the row-N checkpoints found their seqs taken)."""
    now = datetime.now(UTC)
    claims = CheckpointClaims(tenant_id, seq, row_hash, now)
    inserted = await session.scalar(
        text("SELECT audit_checkpoint_insert(:tenant_id, :seq, :row_hash, :signed_at, :kid, :jws)"),
        {
            "tenant_id": tenant_id,
            "seq": seq,
            "row_hash": row_hash,
            "signed_at": now,
            "kid": str(key.kid),
            "jws": sign(claims, key),
        },
    )
    return bool(inserted)


async def run_checkpoints(
    sessionmaker: async_sessionmaker[AsyncSession], kek: KeyEncryptionKey
) -> int:
    async with sessionmaker.begin() as session:
        return await sign_due_checkpoints(session, kek)


async def checkpoint_periodically(
    sessionmaker: async_sessionmaker[AsyncSession], kek: KeyEncryptionKey, every_seconds: float
) -> None:
    """The in-process signer (one per API process; duplicates are ignored by the primary key)."""
    import asyncio

    log = _log
    while True:
        await asyncio.sleep(every_seconds)
        try:
            made = await run_checkpoints(sessionmaker, kek)
        except NoAuditKey as exc:
            log.error("audit_checkpoint_failed", reason=str(exc))  # noqa: TRY400 (no trace)
        except Exception as exc:
            # The type only: a driver message can quote SQL and values.
            log.error("audit_checkpoint_failed", error_type=type(exc).__name__)  # noqa: TRY400
        else:
            if made:
                log.info("audit_checkpoints_signed", count=made)
