"""Actors appear in the audit log as pseudonyms: HMAC-SHA256(tenant key, subject).

Each tenant has its own random key (sealed with the key-encryption key), so a pseudonym means
nothing outside its tenant and cannot be brute-forced from a list of likely subjects without
the key. The pseudonym → subject mapping lives in `audit_actors`, an ordinary table: erasing a
subject deletes its mapping and the log keeps a pseudonym that no longer resolves.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import uuid

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.auth.keys import KeyEncryptionKey
from service.db.models import AuditActor, AuditPseudonymKey

_KNOWN_LIMIT = 50_000


def _sealing_id(tenant_id: uuid.UUID) -> str:
    return f"audit-pseudonym:{tenant_id}"


class Pseudonyms:
    """Keys and mappings are written in their own short transactions (never the request's, which
    may roll back) and cached per process."""

    def __init__(self, sessionmaker: async_sessionmaker[AsyncSession], kek: KeyEncryptionKey):
        self._sessionmaker = sessionmaker
        self._kek = kek
        self._keys: dict[uuid.UUID, bytes] = {}
        self._known: set[tuple[uuid.UUID, str]] = set()

    async def of(self, tenant_id: uuid.UUID, subject: str, principal_id: uuid.UUID | None) -> str:
        pseudonym = self.compute(await self.key(tenant_id), subject)
        if (tenant_id, pseudonym) not in self._known:
            async with self._sessionmaker.begin() as session:
                await session.execute(
                    insert(AuditActor)
                    .values(
                        tenant_id=tenant_id,
                        pseudonym=pseudonym,
                        subject=subject,
                        principal_id=principal_id,
                    )
                    .on_conflict_do_nothing()
                )
            if len(self._known) >= _KNOWN_LIMIT:
                self._known.clear()
            self._known.add((tenant_id, pseudonym))
        return pseudonym

    async def lookup(self, tenant_id: uuid.UUID, subject: str) -> str:
        """The pseudonym a subject has (or would have), for filtering the log by actor."""
        return self.compute(await self.key(tenant_id), subject)

    @staticmethod
    def compute(key: bytes, subject: str) -> str:
        return hmac.new(key, subject.encode(), hashlib.sha256).hexdigest()

    async def key(self, tenant_id: uuid.UUID) -> bytes:
        cached = self._keys.get(tenant_id)
        if cached is not None:
            return cached
        async with self._sessionmaker.begin() as session:
            sealed = await self._sealed_key(session, tenant_id)
        key = self._kek.open(_sealing_id(tenant_id), sealed)
        self._keys[tenant_id] = key
        return key

    async def _sealed_key(self, session: AsyncSession, tenant_id: uuid.UUID) -> bytes:
        query = select(AuditPseudonymKey.key_encrypted).where(
            AuditPseudonymKey.tenant_id == tenant_id
        )
        sealed = await session.scalar(query)
        if sealed is None:
            fresh = self._kek.seal(_sealing_id(tenant_id), os.urandom(32))
            await session.execute(
                insert(AuditPseudonymKey)
                .values(tenant_id=tenant_id, key_encrypted=fresh)
                .on_conflict_do_nothing()
            )
            sealed = await session.scalar(query)
        assert sealed is not None  # inserted above, or by a concurrent first request
        return sealed
