"""Sealing memory text under per-owner data keys, and opening it again (docs/erasure.md,
"Crypto-shredding").

A crypto-shredding tenant's memory text is stored as AES-256-GCM ciphertext under a data key of
the row's owner; `memories.value` then holds no text. The data key is random (32 bytes), kept
in a `DataKeyStore` outside PostgreSQL, wrapped by the key-encryption key (AAD: tenant, owner
and key id, so a wrapped key cannot be passed off as another owner's). The ciphertext's AAD
binds the tenant, the owner, the memory id and the key id, so a sealed value moved to another
row, owner or tenant does not open. Destroying the owner's data key makes every copy of that
ciphertext (WAL, replicas, base backups, a copied data directory) unreadable.

Unwrapped keys are cached per process, bounded in number and age, and dropped at once when this
process destroys them; they are never logged. Sealing asks the store every time whether the
owner's key still exists (another process may have destroyed it: a text sealed under a
destroyed key would be lost), and opening asks it again when the cached key is not the row's.
"""

from __future__ import annotations

import os
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import structlog
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from service.auth.keys import KeyEncryptionKey
from service.problems import ServiceUnavailable
from service.shredding.keystore import DataKeyStore, KeyStoreUnavailable, StoredKey

CACHE_KEYS = 1024
"""Unwrapped data keys one process keeps."""
CACHE_SECONDS = 60.0
"""How long one is kept: a key another replica destroyed stops opening here after this."""
_VALUE_AAD = b"memgate.value.v1"
_log = structlog.get_logger("memgate.shredding")
NONCE_BYTES = 12


class KeyDestroyed(Exception):
    """The data key a sealed value needs is gone (erased), or is not the one it was sealed
    under: the text cannot be recovered."""


class KeyUnopenable(Exception):
    """A data key is in the store but does not open with this key-encryption key (another
    MEMGATE_KEY_ENCRYPTION_KEY wrapped it). Not an erasure: the call fails rather than read the
    text as gone, and no new key is made beside it."""


class SealedRow(Protocol):
    """What opening a row needs: who it belongs to and its ciphertext."""

    @property
    def tenant_id(self) -> uuid.UUID: ...
    @property
    def owner_id(self) -> uuid.UUID: ...
    @property
    def id(self) -> uuid.UUID: ...
    @property
    def value_key(self) -> uuid.UUID | None: ...
    @property
    def value_sealed(self) -> bytes | None: ...


@dataclass(frozen=True)
class Sealed:
    key_id: uuid.UUID
    blob: bytes


def key_slot(owner_id: uuid.UUID, memory_id: uuid.UUID, key_id: uuid.UUID | None) -> uuid.UUID:
    """Whose data key seals a row: its owner's, except a consolidation summary's, which has a
    key of its own whose id is the row's (`Vault.seal(own_key=True)`). A summary quotes the
    people whose notes it was built from and is erased with them as a derived row: its own key
    is destroyed with it, where the writer's key (the job's, shared by every summary) stays."""
    return memory_id if key_id == memory_id else owner_id


def _wrap_label(tenant_id: uuid.UUID, owner_id: uuid.UUID, key_id: uuid.UUID) -> str:
    return f"memgate.data-key.v1:{tenant_id}:{owner_id}:{key_id}"


def _value_aad(
    tenant_id: uuid.UUID, owner_id: uuid.UUID, memory_id: uuid.UUID, key_id: uuid.UUID
) -> bytes:
    return _VALUE_AAD + tenant_id.bytes + owner_id.bytes + memory_id.bytes + key_id.bytes


SEALED_ANSWER = b"\x00memgate-sealed-answer.v1"
"""How a sealed stored answer begins (a JSON answer never begins with a NUL byte)."""


def _answer_aad(tenant_id: uuid.UUID, owner_id: uuid.UUID, label: str, key_id: uuid.UUID) -> bytes:
    return SEALED_ANSWER + tenant_id.bytes + owner_id.bytes + key_id.bytes + label.encode()


class Vault:
    """Seals and opens memory text; destroys data keys. One per process (`Runtime.vault`)."""

    def __init__(
        self, store: DataKeyStore, kek: KeyEncryptionKey, *, on_kubernetes: bool = False
    ) -> None:
        self.store = store
        self._kek = kek
        self._on_kubernetes = on_kubernetes
        self._cache: OrderedDict[tuple[uuid.UUID, uuid.UUID], tuple[float, uuid.UUID, bytes]]
        self._cache = OrderedDict()

    def refusal(self) -> str | None:
        """Why no tenant may turn crypto-shredding on here (None: it may). A pod's file store
        is neither shared with the other replicas nor kept when the pod goes: keys made there
        would be lost, and with them the text."""
        if self._on_kubernetes and not self.store.shared:
            return (
                "this deployment runs on Kubernetes with the file data key store, which the "
                "replicas do not share: set MEMGATE_DATA_KEY_STORE to a KMS store first"
            )
        return None

    async def seal(
        self,
        tenant_id: uuid.UUID,
        owner_id: uuid.UUID,
        memory_id: uuid.UUID,
        text: str,
        *,
        own_key: bool = False,
    ) -> Sealed:
        """`text` sealed under the owner's data key (made on first use), or with `own_key`
        under a key of the row's own (its id the row's: `key_slot`)."""
        slot = memory_id if own_key else owner_id
        found = await self._current(
            tenant_id, slot, make=True, key_id=memory_id if own_key else None, fresh=True
        )
        assert found is not None  # made when missing
        key_id, key = found
        nonce = os.urandom(NONCE_BYTES)
        aad = _value_aad(tenant_id, slot, memory_id, key_id)
        return Sealed(key_id, nonce + AESGCM(key).encrypt(nonce, text.encode(), aad))

    async def open(self, row: SealedRow) -> str:
        """The row's text. Raises `KeyDestroyed` when its key is gone or does not fit."""
        if row.value_sealed is None or row.value_key is None:
            raise ValueError("not a sealed row")
        slot = key_slot(row.owner_id, row.id, row.value_key)
        found = await self._current(row.tenant_id, slot, make=False, want=row.value_key)
        if found is None or found[0] != row.value_key:
            raise KeyDestroyed(f"the data key of memory {row.id} is destroyed")
        key_id, key = found
        blob = bytes(row.value_sealed)
        aad = _value_aad(row.tenant_id, slot, row.id, key_id)
        try:
            return AESGCM(key).decrypt(blob[:NONCE_BYTES], blob[NONCE_BYTES:], aad).decode()
        except InvalidTag:
            raise KeyDestroyed(f"memory {row.id}'s sealed value does not open") from None

    async def plaintexts(self, rows: Iterable[Any]) -> dict[uuid.UUID, str]:
        """The text of every sealed row of `rows`, by id (unsealed rows are left out: their
        `value` is the text). A row whose key is destroyed maps to "": nothing to show."""
        opened: dict[uuid.UUID, str] = {}
        for row in rows:
            if getattr(row, "value_sealed", None) is None:
                continue
            try:
                opened[row.id] = await self.open(row)
            except KeyDestroyed:
                opened[row.id] = ""
        return opened

    async def seal_answer(
        self, tenant_id: uuid.UUID, owner_id: uuid.UUID, label: str, data: bytes
    ) -> bytes:
        """A stored answer that holds memory text (an idempotent write's), sealed under the
        caller's data key like the rows it names: `SEALED_ANSWER`, key id, nonce, ciphertext;
        `label` (the answer's place) is bound in, so it opens nowhere else."""
        found = await self._current(tenant_id, owner_id, make=True, fresh=True)
        assert found is not None  # made when missing
        key_id, key = found
        nonce = os.urandom(NONCE_BYTES)
        aad = _answer_aad(tenant_id, owner_id, label, key_id)
        return SEALED_ANSWER + key_id.bytes + nonce + AESGCM(key).encrypt(nonce, data, aad)

    async def open_answer(
        self, tenant_id: uuid.UUID, owner_id: uuid.UUID, label: str, sealed: bytes
    ) -> bytes:
        """`seal_answer`'s bytes opened; raises `KeyDestroyed` when the key is gone."""
        body = sealed[len(SEALED_ANSWER) :]
        key_id = uuid.UUID(bytes=body[:16])
        found = await self._current(tenant_id, owner_id, make=False, want=key_id)
        if found is None or found[0] != key_id:
            raise KeyDestroyed("the data key of a stored answer is destroyed")
        nonce, ciphertext = body[16 : 16 + NONCE_BYTES], body[16 + NONCE_BYTES :]
        aad = _answer_aad(tenant_id, owner_id, label, key_id)
        try:
            return AESGCM(found[1]).decrypt(nonce, ciphertext, aad)
        except InvalidTag:
            raise KeyDestroyed("a stored answer does not open") from None

    async def destroy_owners(
        self, tenant_id: uuid.UUID, owners: Sequence[uuid.UUID]
    ) -> list[uuid.UUID]:
        """Destroy the data keys of these key slots (owners, or job-written rows: `key_slot`);
        answer the ids of those that existed."""
        destroyed = []
        for owner_id in owners:
            self._cache.pop((tenant_id, owner_id), None)
            key_id = await self.store.destroy(tenant_id, owner_id)
            if key_id is not None:
                destroyed.append(key_id)
        return destroyed

    async def destroy_tenant(self, tenant_id: uuid.UUID) -> list[uuid.UUID]:
        for cached in [one for one in self._cache if one[0] == tenant_id]:
            del self._cache[cached]
        return await self.store.destroy_tenant(tenant_id)

    async def _current(
        self,
        tenant_id: uuid.UUID,
        owner_id: uuid.UUID,
        *,
        make: bool,
        key_id: uuid.UUID | None = None,
        fresh: bool = False,
        want: uuid.UUID | None = None,
    ) -> tuple[uuid.UUID, bytes] | None:
        """The slot's key. From the cache only to open (`want`: the key id the row names,
        which the cached key must be); `fresh` (sealing) asks the store whether it still
        exists, and unwraps only a key the cache does not hold."""
        slot = (tenant_id, owner_id)
        cached = self._cache.get(slot)
        now = time.monotonic()
        usable = cached is not None and now - cached[0] < CACHE_SECONDS
        if usable and not fresh and cached is not None and (want is None or cached[1] == want):
            self._cache.move_to_end(slot)
            return cached[1], cached[2]
        try:
            stored = await self._stored(tenant_id, owner_id, make=make, key_id=key_id)
        except KeyStoreUnavailable as exc:
            # The store's own words (a folder, a KMS error; never a key) go to the log only.
            _log.warning("data key store failed", error=str(exc))
            raise ServiceUnavailable(
                "The data key store this tenant's memory text is sealed with did not answer, "
                "so the call could not read or write that text; nothing was changed. Retry later."
            ) from None
        if stored is None:
            self._cache.pop(slot, None)
            return None
        if usable and cached is not None and cached[1] == stored.key_id:
            self._cache.move_to_end(slot)
            return cached[1], cached[2]
        key = self._unwrap(tenant_id, owner_id, stored)
        self._cache[slot] = (now, stored.key_id, key)
        self._cache.move_to_end(slot)
        while len(self._cache) > CACHE_KEYS:
            self._cache.popitem(last=False)
        return stored.key_id, key

    async def _stored(
        self, tenant_id: uuid.UUID, owner_id: uuid.UUID, *, make: bool, key_id: uuid.UUID | None
    ) -> StoredKey | None:
        """The slot's key as the store holds it; made there first when `make` and missing."""
        stored = await self.store.fetch(tenant_id, owner_id)
        if stored is not None or not make:
            return stored
        key_id = key_id or uuid.uuid4()
        wrapped = self._kek.seal(_wrap_label(tenant_id, owner_id, key_id), os.urandom(32))
        return await self.store.create(tenant_id, owner_id, StoredKey(key_id, wrapped))

    def _unwrap(self, tenant_id: uuid.UUID, owner_id: uuid.UUID, stored: StoredKey) -> bytes:
        try:
            return self._kek.open(_wrap_label(tenant_id, owner_id, stored.key_id), stored.wrapped)
        except InvalidTag:
            raise KeyUnopenable(
                "a data key does not open with this MEMGATE_KEY_ENCRYPTION_KEY"
            ) from None


def vault_of(session: Any) -> Vault:
    """The process's vault, carried by every session its runtime makes (`Runtime.vault`). A
    session made elsewhere (a one-off CLI engine) has none: it reads unsealed rows as ever,
    and fails loudly on the first sealed row it would have to open or write."""
    found = session.info.get("vault")
    return found if isinstance(found, Vault) else _NO_VAULT


class _NoVault(Vault):
    def __init__(self) -> None:
        self._cache = OrderedDict()

    def refusal(self) -> str | None:
        return "this process has no data key store"

    async def _current(self, *_: Any, **__: Any) -> tuple[uuid.UUID, bytes] | None:
        raise TypeError("this session was not made by a runtime: it has no data key store")


_NO_VAULT = _NoVault()


async def opened_value(session: Any, row: Any) -> str:
    """One row's text: its `value`, or its sealed value opened ("" when the key is gone)."""
    if getattr(row, "value_sealed", None) is None:
        return str(row.value)
    return (await vault_of(session).plaintexts([row]))[row.id]
