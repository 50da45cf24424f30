"""Where the per-owner data keys live: outside PostgreSQL, so that no copy of the database
(a base backup, archived WAL, a replica, a copied data directory) holds them. Destroying an
owner's key here is what makes every such copy of that owner's sealed text unreadable.

A store keeps each key *wrapped* (sealed under the key-encryption key by `service.shredding.
vault`); it never sees a key in the clear. Two kinds:

- `FileKeyStore`: one file per (tenant, owner) under memgate's data dir, the embedded default.
  It lives on one machine: it is not shared between replicas (`shared = False`).
- anything else implementing `DataKeyStore`, named by `MEMGATE_DATA_KEY_STORE=module:factory`
  (the KMS plug point): a KMS or a vault service reachable from every replica.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import os
import secrets
import stat
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import anyio

from service.settings import Settings

KEY_ID_BYTES = 16


@dataclass(frozen=True)
class StoredKey:
    """One owner's data key as a store keeps it: its id and the wrapped key."""

    key_id: uuid.UUID
    wrapped: bytes


class KeyStoreUnavailable(Exception):
    """The store could not be read or written (a KMS down, a folder not writable)."""


@runtime_checkable
class DataKeyStore(Protocol):
    """The per-owner data keys. Every method may raise `KeyStoreUnavailable`."""

    @property
    def shared(self) -> bool:
        """Whether every replica of the service sees the same keys (a KMS: yes; a folder on one
        machine: no)."""
        ...

    async def create(self, tenant_id: uuid.UUID, owner_id: uuid.UUID, key: StoredKey) -> StoredKey:
        """Store `key` for the owner unless one is there already; answer the one kept (so two
        replicas racing to make the first key both use the same one)."""
        ...

    async def fetch(self, tenant_id: uuid.UUID, owner_id: uuid.UUID) -> StoredKey | None:
        """The owner's key, or None (never made, or destroyed)."""
        ...

    async def destroy(self, tenant_id: uuid.UUID, owner_id: uuid.UUID) -> uuid.UUID | None:
        """Destroy the owner's key for good; answer its id (None: there was none). Idempotent."""
        ...

    async def destroy_tenant(self, tenant_id: uuid.UUID) -> list[uuid.UUID]:
        """Destroy every key of the tenant; answer their ids. Idempotent."""
        ...


class FileKeyStore:
    """One file per (tenant, owner): `<folder>/<tenant>/<owner>.key`, 0600 in 0700 folders,
    holding the key id and the wrapped key. A key file is written to a temporary name and
    linked into place (`link` fails if the name exists, so the first key wins and a reader never
    sees half a file); nothing is opened through a symbolic link. Destroying overwrites the
    file, unlinks it and syncs the folder, so the key is gone from the folder after a crash too
    (the filesystem may still hold the old blocks: keep this folder on an encrypted volume, and
    out of the database's backups)."""

    def __init__(self, folder: Path) -> None:
        self._folder = folder

    @property
    def shared(self) -> bool:
        return False

    # The file work runs on a worker thread: its fsyncs would otherwise stall the event loop.

    async def create(self, tenant_id: uuid.UUID, owner_id: uuid.UUID, key: StoredKey) -> StoredKey:
        await anyio.to_thread.run_sync(self._create, tenant_id, owner_id, key)
        kept = await self.fetch(tenant_id, owner_id)
        if kept is None:
            raise KeyStoreUnavailable("a data key just stored could not be read back")
        return kept

    async def fetch(self, tenant_id: uuid.UUID, owner_id: uuid.UUID) -> StoredKey | None:
        found: StoredKey | None = await anyio.to_thread.run_sync(self._fetch, tenant_id, owner_id)
        return found

    async def destroy(self, tenant_id: uuid.UUID, owner_id: uuid.UUID) -> uuid.UUID | None:
        found: uuid.UUID | None = await anyio.to_thread.run_sync(self._destroy, tenant_id, owner_id)
        return found

    async def destroy_tenant(self, tenant_id: uuid.UUID) -> list[uuid.UUID]:
        found: list[uuid.UUID] = await anyio.to_thread.run_sync(self._destroy_tenant, tenant_id)
        return found

    def _create(self, tenant_id: uuid.UUID, owner_id: uuid.UUID, key: StoredKey) -> None:
        folder = self._tenant_folder(tenant_id, make=True)
        assert folder is not None  # made
        final = folder / f"{owner_id}.key"
        temporary = folder / f".{owner_id}.{secrets.token_hex(8)}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        try:
            fd = os.open(temporary, flags, 0o600)
            try:
                os.write(fd, key.key_id.bytes + key.wrapped)
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(temporary, final, follow_symlinks=False)
            except FileExistsError:
                pass  # another process made the owner's key first: use that one
            finally:
                os.unlink(temporary)
            _sync_folder(folder)
        except OSError as exc:
            raise KeyStoreUnavailable(f"the data key folder {folder} is not writable") from exc

    def _fetch(self, tenant_id: uuid.UUID, owner_id: uuid.UUID) -> StoredKey | None:
        folder = self._tenant_folder(tenant_id, make=False)
        if folder is None:
            return None
        try:
            fd = os.open(folder / f"{owner_id}.key", os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise KeyStoreUnavailable("a data key file could not be opened") from exc
        with os.fdopen(fd, "rb") as handle:
            raw = handle.read()
        if len(raw) <= KEY_ID_BYTES:
            raise KeyStoreUnavailable("a data key file is truncated")
        return StoredKey(uuid.UUID(bytes=raw[:KEY_ID_BYTES]), raw[KEY_ID_BYTES:])

    def _destroy(self, tenant_id: uuid.UUID, owner_id: uuid.UUID) -> uuid.UUID | None:
        folder = self._tenant_folder(tenant_id, make=False)
        if folder is None:
            return None
        destroyed = self._shred(folder, folder / f"{owner_id}.key")
        for leftover in folder.glob(f".{owner_id}.*.shred"):  # a destroy that crashed midway
            self._wipe(folder, leftover)
        return destroyed

    def _destroy_tenant(self, tenant_id: uuid.UUID) -> list[uuid.UUID]:
        folder = self._tenant_folder(tenant_id, make=False)
        if folder is None:
            return []
        destroyed = [
            key_id
            for path in sorted(folder.glob("*.key"))
            if (key_id := self._shred(folder, path)) is not None
        ]
        for leftover in folder.glob(".*.shred"):  # destroys that crashed midway
            self._wipe(folder, leftover)
        for leftover in folder.glob(".*.tmp"):  # a create that crashed before its link
            leftover.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            folder.rmdir()
            _sync_folder(self._folder)
        return destroyed

    def _shred(self, folder: Path, path: Path) -> uuid.UUID | None:
        """Take the key off its name first (a rename, synced), then overwrite and unlink it: a
        crash in between leaves no half-wiped file where `fetch` looks, only a hidden one the
        next destroy of the owner (or the tenant) wipes."""
        hidden = folder / f".{path.stem}.{secrets.token_hex(8)}.shred"
        try:
            os.rename(path, hidden)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise KeyStoreUnavailable("a data key file could not be removed") from exc
        _sync_folder(folder)
        return self._wipe(folder, hidden)

    def _wipe(self, folder: Path, path: Path) -> uuid.UUID | None:
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise KeyStoreUnavailable("a data key file could not be opened") from exc
        try:
            raw = os.read(fd, 4096)
            os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, b"\0" * len(raw))
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.unlink(path)
            _sync_folder(folder)
        except OSError as exc:
            raise KeyStoreUnavailable("a data key file could not be removed") from exc
        key_id = raw[:KEY_ID_BYTES]
        return uuid.UUID(bytes=key_id) if len(raw) >= KEY_ID_BYTES and any(key_id) else None

    def _tenant_folder(self, tenant_id: uuid.UUID, *, make: bool) -> Path | None:
        root = self._folder
        folder = root / str(tenant_id)
        for one in (root, folder):
            if make:
                try:
                    one.mkdir(mode=0o700, parents=one is root, exist_ok=True)
                except OSError as exc:
                    raise KeyStoreUnavailable(f"{one} could not be made") from exc
            try:
                found = os.lstat(one)
            except FileNotFoundError:
                return None
            if not stat.S_ISDIR(found.st_mode) or found.st_mode & 0o077:
                # A symbolic link, a file, or a folder others may read: not where keys go.
                raise KeyStoreUnavailable(
                    f"{one} must be a folder of its own, mode 0700, not a symbolic link"
                )
        return folder


def _sync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as exc:  # some filesystems cannot sync a folder; the unlink still stands
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def key_store_from(settings: Settings) -> DataKeyStore:
    """The store `MEMGATE_DATA_KEY_STORE` names."""
    named = settings.shredding.data_key_store
    if named == "file":
        return FileKeyStore(settings.shredding.key_dir(settings.database.data_dir))
    module, _, attribute = named.partition(":")
    factory = getattr(importlib.import_module(module), attribute)
    store = factory(settings)
    if not isinstance(store, DataKeyStore):
        raise SystemExit(f"MEMGATE_DATA_KEY_STORE={named} did not make a DataKeyStore")
    return store
