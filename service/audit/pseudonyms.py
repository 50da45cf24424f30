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
from sqlalchemy.ext.asyncio import AsyncSession

from service.auth.keys import KeyEncryptionKey
from service.db.models import AuditActor, AuditPseudonymKey

_KNOWN_LIMIT = 50_000


def _sealing_id(tenant_id: uuid.UUID) -> str:
    return f"audit-pseudonym:{tenant_id}"


class Pseudonyms:
    """Works inside the caller's transaction (the one that appends the audit row), so an audit
    row never waits for a second pooled connection. Only what is known to be committed is
    cached: a key or mapping this transaction inserted could still roll back."""

    def __init__(self, kek: KeyEncryptionKey):
        self._kek = kek
        self._keys: dict[uuid.UUID, bytes] = {}
        self._known: set[tuple[uuid.UUID, str]] = set()

    async def of(
        self,
        session: AsyncSession,
        tenant_id: uuid.UUID,
        subject: str,
        principal_id: uuid.UUID | None,
    ) -> str:
        pseudonym = self.compute(await self.key(session, tenant_id), subject)
        if (tenant_id, pseudonym) not in self._known:
            inserted = await session.scalar(
                insert(AuditActor)
                .values(
                    tenant_id=tenant_id,
                    pseudonym=pseudonym,
                    subject=subject,
                    principal_id=principal_id,
                )
                .on_conflict_do_nothing()
                .returning(AuditActor.pseudonym)
            )
            if inserted is None:  # it was there already: committed by an earlier call
                if len(self._known) >= _KNOWN_LIMIT:
                    self._known.clear()
                self._known.add((tenant_id, pseudonym))
        return pseudonym

    async def lookup(self, session: AsyncSession, tenant_id: uuid.UUID, subject: str) -> str:
        """The pseudonym a subject has (or would have), without recording it."""
        return self.compute(await self.key(session, tenant_id), subject)

    @staticmethod
    def compute(key: bytes, subject: str) -> str:
        return hmac.new(key, subject.encode(), hashlib.sha256).hexdigest()

    async def key(self, session: AsyncSession, tenant_id: uuid.UUID) -> bytes:
        cached = self._keys.get(tenant_id)
        if cached is not None:
            return cached
        query = select(AuditPseudonymKey.key_encrypted).where(
            AuditPseudonymKey.tenant_id == tenant_id
        )
        sealed = await session.scalar(query)
        if sealed is not None:
            key = self._kek.open(_sealing_id(tenant_id), sealed)
            self._keys[tenant_id] = key
            return key
        # First use: a concurrent first use waits on the primary key, then reads the winner's.
        fresh = self._kek.seal(_sealing_id(tenant_id), os.urandom(32))
        await session.execute(
            insert(AuditPseudonymKey)
            .values(tenant_id=tenant_id, key_encrypted=fresh)
            .on_conflict_do_nothing()
        )
        sealed = await session.scalar(query)
        assert sealed is not None
        return self._kek.open(_sealing_id(tenant_id), sealed)
