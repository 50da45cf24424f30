"""Signing keys of the embedded issuer, stored in the database with the private half encrypted.

Life cycle: a `next` key is published in the JWKS before it signs anything, so every verifier
already knows it when rotation promotes it to `active`; the old active key turns `retired` and
keeps verifying until tokens it signed have expired, then it is dropped.

Only the owner role writes keys (`ensure_keys`, `rotate` take an owner's session): the app role
reads them and nothing more, so a stolen app login cannot publish a key of its own (review
item 5).
"""

from __future__ import annotations

import base64
import json
import os
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from joserfc.errors import JoseError
from joserfc.jwk import ECKey, KeyParameters, OKPKey
from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.models import SigningKey

_KEK_FILE = "key-encryption.key"


@dataclass(frozen=True)
class KeyEncryptionKey:
    """AES-256-GCM key that wraps private signing keys at rest (AAD = kid)."""

    raw: bytes

    @classmethod
    def from_setting_or_file(cls, setting: str, data_dir: Path) -> KeyEncryptionKey:
        if setting:
            raw = base64.urlsafe_b64decode(setting + "=" * (-len(setting) % 4))
            if len(raw) != 32:
                raise ValueError("MEMGATE_KEY_ENCRYPTION_KEY must be 32 bytes, base64url encoded")
            return cls(raw)
        path = data_dir / _KEK_FILE
        if not path.exists():
            data_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(os.urandom(32))
        return cls(path.read_bytes())

    def seal(self, kid: str, plaintext: bytes) -> bytes:
        nonce = os.urandom(12)
        return nonce + AESGCM(self.raw).encrypt(nonce, plaintext, kid.encode())

    def open(self, kid: str, sealed: bytes) -> bytes:
        return AESGCM(self.raw).decrypt(sealed[:12], sealed[12:], kid.encode())


SigningJwk = ECKey | OKPKey


class WrongKeyEncryptionKey(Exception):
    """Keys in the database that this key-encryption key cannot open: another
    MEMGATE_KEY_ENCRYPTION_KEY sealed them. Making new keys beside them would leave the
    processes that hold the other key unable to sign, so the owner's commands refuse."""

    def __init__(self, what: str) -> None:
        super().__init__(
            f"{what} cannot be opened with this MEMGATE_KEY_ENCRYPTION_KEY: another key sealed "
            "them; give every process the key the first `memgate migrate` used"
        )


def _generate(alg: str, kid: str) -> SigningJwk:
    params: KeyParameters = {"kid": kid, "alg": alg, "use": "sig"}
    if alg == "EdDSA":
        return OKPKey.generate_key("Ed25519", parameters=params)
    return ECKey.generate_key("P-256", parameters=params)


def _import(alg: str, private: dict[str, Any]) -> SigningJwk:
    if alg == "EdDSA":
        return OKPKey.import_key(private)
    return ECKey.import_key(private)


def _new_row(alg: str, kek: KeyEncryptionKey, state: str) -> SigningKey:
    kid = f"{datetime.now(UTC):%Y%m%d}-{uuid.uuid4().hex[:8]}"
    key = _generate(alg, kid)
    private = json.dumps(key.as_dict(private=True)).encode()
    now = datetime.now(UTC)
    return SigningKey(
        kid=kid,
        alg=alg,
        state=state,
        public_jwk=key.as_dict(private=False),
        private_key_encrypted=kek.seal(kid, private),
        activated_at=now if state == "active" else None,
    )


async def ensure_keys(session: AsyncSession, alg: str, kek: KeyEncryptionKey) -> None:
    """Make sure an `active` and a `next` key exist (first start, or after manual cleanup),
    and that the ones already there open with `kek` (WrongKeyEncryptionKey otherwise)."""
    unopenable = await unopenable_signing_keys(session, kek)
    if unopenable:
        raise WrongKeyEncryptionKey(f"the {' and '.join(unopenable)} token signing keys")
    states = set((await session.scalars(select(SigningKey.state))).all())
    if "active" not in states:
        session.add(_new_row(alg, kek, "active"))
    if "next" not in states:
        session.add(_new_row(alg, kek, "next"))
    await session.flush()


async def rotate(session: AsyncSession, alg: str, kek: KeyEncryptionKey, keep: timedelta) -> str:
    """Promote `next` to `active`, retire the old active key, publish a fresh `next`, and drop
    retired keys older than `keep` (max token TTL + JWKS cache TTL + leeway).

    Returns the kid that now signs."""
    await ensure_keys(session, alg, kek)
    now = datetime.now(UTC)
    await session.execute(
        delete(SigningKey).where(SigningKey.state == "retired", SigningKey.retired_at < now - keep)
    )
    await session.execute(
        update(SigningKey)
        .where(SigningKey.state == "active")
        .values(state="retired", retired_at=now)
    )
    promoted = await session.scalar(
        update(SigningKey)
        .where(SigningKey.state == "next")
        .values(state="active", activated_at=now)
        .returning(SigningKey.kid)
    )
    session.add(_new_row(alg, kek, "next"))
    await session.flush()
    if promoted is None:
        raise RuntimeError("no 'next' signing key to promote")
    return str(promoted)


async def unopenable_signing_keys(session: AsyncSession, kek: KeyEncryptionKey) -> list[str]:
    """The states (`active`, `next`) of the signing keys `kek` cannot open: the ones a process
    signs with now or after the next rotation."""
    rows = await session.scalars(
        select(SigningKey)
        .where(SigningKey.state.in_(("active", "next")))
        .order_by(SigningKey.state)
    )
    failed = []
    for row in rows:
        try:
            _import(row.alg, json.loads(kek.open(row.kid, row.private_key_encrypted)))
        except (InvalidTag, ValueError, TypeError, JoseError):
            failed.append(row.state)
    return failed


async def has_active_key(session: AsyncSession) -> bool:
    return (
        await session.scalar(select(SigningKey.kid).where(SigningKey.state == "active"))
    ) is not None


async def active_signing_key(session: AsyncSession, kek: KeyEncryptionKey) -> SigningJwk:
    row = (
        await session.execute(select(SigningKey).where(SigningKey.state == "active"))
    ).scalar_one()
    private = kek.open(row.kid, row.private_key_encrypted)
    return _import(row.alg, json.loads(private))


async def published_jwks(session: AsyncSession) -> dict[str, Any]:
    """Public keys in every state: `next` so verifiers know it before it signs, `retired` so
    tokens it signed keep verifying until they expire."""
    rows = (await session.scalars(select(SigningKey).order_by(SigningKey.created_at))).all()
    return {"keys": [row.public_jwk for row in rows]}
