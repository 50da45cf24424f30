"""The data key stores and the vault, without a database: the file store's files and folders,
the KMS plug point, and that a sealed value opens only in its own place."""

from __future__ import annotations

import os
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from service.auth.keys import KeyEncryptionKey
from service.settings import Settings, ShreddingSettings
from service.shredding import (
    FileKeyStore,
    KeyDestroyed,
    KeyStoreUnavailable,
    KeyUnopenable,
    StoredKey,
    Vault,
    key_store_from,
)
from tests.fixtures.kms import MemoryKms

TENANT, OWNER, OTHER = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()


def _kek() -> KeyEncryptionKey:
    return KeyEncryptionKey(os.urandom(32))


class _Row:
    def __init__(self, memory_id: uuid.UUID, sealed: bytes, key_id: uuid.UUID, **where: uuid.UUID):
        self.id, self.value_sealed, self.value_key = memory_id, sealed, key_id
        self.tenant_id = where.get("tenant_id", TENANT)
        self.owner_id = where.get("owner_id", OWNER)


async def test_the_file_store_keeps_one_key_per_owner_private_and_destroys_it(
    tmp_path: Path,
) -> None:
    store = FileKeyStore(tmp_path / "keys")
    first = await store.create(TENANT, OWNER, StoredKey(uuid.uuid4(), b"wrapped-1"))
    # A second replica racing to make the owner's first key gets the one kept.
    second = await store.create(TENANT, OWNER, StoredKey(uuid.uuid4(), b"wrapped-2"))
    assert second == first
    path = tmp_path / "keys" / str(TENANT) / f"{OWNER}.key"
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert oct(path.parent.stat().st_mode & 0o777) == "0o700"
    assert oct((tmp_path / "keys").stat().st_mode & 0o777) == "0o700"
    assert not list(path.parent.glob(".*.tmp"))
    assert await store.destroy(TENANT, OWNER) == first.key_id
    assert not path.exists()
    assert await store.fetch(TENANT, OWNER) is None
    assert await store.destroy(TENANT, OWNER) is None  # idempotent
    await store.create(TENANT, OTHER, StoredKey(uuid.uuid4(), b"w"))
    assert len(await store.destroy_tenant(TENANT)) == 1
    assert not (tmp_path / "keys" / str(TENANT)).exists()


async def test_the_file_store_refuses_a_symbolic_link_or_an_open_folder(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (tmp_path / "keys").mkdir(mode=0o700)
    (tmp_path / "keys" / str(TENANT)).symlink_to(elsewhere)
    store = FileKeyStore(tmp_path / "keys")
    with pytest.raises(KeyStoreUnavailable, match="symbolic link"):
        await store.create(TENANT, OWNER, StoredKey(uuid.uuid4(), b"w"))
    assert not list(elsewhere.iterdir())
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o755)
    with pytest.raises(KeyStoreUnavailable, match="0700"):
        await FileKeyStore(shared).create(TENANT, OWNER, StoredKey(uuid.uuid4(), b"w"))


async def test_the_kms_plug_point_is_named_by_a_setting(tmp_path: Path) -> None:
    named = ShreddingSettings(data_key_store="tests.fixtures.kms:MemoryKms")
    settings = replace(Settings(), shredding=named)
    store = key_store_from(settings)
    assert isinstance(store, MemoryKms)
    assert store.shared
    vault = Vault(store, _kek(), on_kubernetes=True)
    assert vault.refusal() is None  # a shared store may shred on Kubernetes
    memory_id = uuid.uuid4()
    sealed = await vault.seal(TENANT, OWNER, memory_id, "the text")
    assert await vault.open(_Row(memory_id, sealed.blob, sealed.key_id)) == "the text"
    assert await vault.destroy_owners(TENANT, [OWNER]) == [sealed.key_id]
    with pytest.raises(KeyDestroyed):
        await vault.open(_Row(memory_id, sealed.blob, sealed.key_id))
    with pytest.raises(ValueError, match="module:factory"):
        ShreddingSettings(data_key_store="kms")
    file_vault = Vault(key_store_from(Settings()), _kek(), on_kubernetes=True)
    assert file_vault.refusal() is not None


async def test_a_sealed_value_opens_only_in_its_own_place(tmp_path: Path) -> None:
    kek = _kek()
    vault = Vault(FileKeyStore(tmp_path / "keys"), kek)
    memory_id = uuid.uuid4()
    sealed = await vault.seal(TENANT, OWNER, memory_id, "qx9 secret")
    assert b"qx9" not in sealed.blob
    assert await vault.open(_Row(memory_id, sealed.blob, sealed.key_id)) == "qx9 secret"
    await vault.seal(TENANT, OTHER, uuid.uuid4(), "another owner's")
    for moved in (
        _Row(uuid.uuid4(), sealed.blob, sealed.key_id),  # to another row
        _Row(memory_id, sealed.blob, sealed.key_id, owner_id=OTHER),  # to another owner
        _Row(memory_id, sealed.blob, uuid.uuid4()),  # naming another key
    ):
        with pytest.raises(KeyDestroyed):
            await vault.open(moved)
    # Another key-encryption key cannot unwrap the owner's data key: an error, not an erasure.
    stranger = Vault(FileKeyStore(tmp_path / "keys"), _kek())
    with pytest.raises(KeyUnopenable):
        await stranger.open(_Row(memory_id, sealed.blob, sealed.key_id))
    # A summary's own key: its id is the row's, and destroying it leaves the owner's key alone.
    summary_id = uuid.uuid4()
    own = await vault.seal(TENANT, OWNER, summary_id, "quotes qx9 secret", own_key=True)
    assert own.key_id == summary_id
    assert (tmp_path / "keys" / str(TENANT) / f"{summary_id}.key").is_file()
    assert await vault.open(_Row(summary_id, own.blob, own.key_id)) == "quotes qx9 secret"
    assert await vault.destroy_owners(TENANT, [summary_id]) == [summary_id]
    with pytest.raises(KeyDestroyed):
        await vault.open(_Row(summary_id, own.blob, own.key_id))
    assert await vault.open(_Row(memory_id, sealed.blob, sealed.key_id)) == "qx9 secret"
    # Stored answers: bound to their place the same way.
    answer = await vault.seal_answer(TENANT, OWNER, "idem|a", b'{"value":"qx9 secret"}')
    assert b"qx9" not in answer
    assert await vault.open_answer(TENANT, OWNER, "idem|a", answer) == b'{"value":"qx9 secret"}'
    with pytest.raises(KeyDestroyed):
        await vault.open_answer(TENANT, OWNER, "idem|b", answer)


async def test_a_write_on_another_worker_after_the_erasure_is_sealed_under_a_new_key(
    tmp_path: Path,
) -> None:
    """Red team: `memgate serve`'s workers share one file store, each with its own cache. A
    worker that cached Alice's key before another destroyed it sealed her next write under the
    destroyed key (answered 201, its text gone for good). Sealing now asks the store."""
    kek = _kek()
    worker_a, worker_b = (Vault(FileKeyStore(tmp_path / "keys"), kek) for _ in range(2))
    await worker_b.seal(TENANT, OWNER, uuid.uuid4(), "before the erasure")  # B caches the key
    await worker_a.destroy_owners(TENANT, [OWNER])  # the erasure, on A
    memory_id = uuid.uuid4()
    sealed = await worker_b.seal(TENANT, OWNER, memory_id, "written after the erasure")
    fresh = Vault(FileKeyStore(tmp_path / "keys"), kek)
    row = _Row(memory_id, sealed.blob, sealed.key_id)
    assert await fresh.open(row) == "written after the erasure"


async def test_a_worker_caching_a_destroyed_key_opens_the_new_one(tmp_path: Path) -> None:
    """Red team: the other way round, a worker still caching the destroyed key answered "" for
    rows sealed under the owner's new key, for up to 60 s. Opening asks the store again."""
    kek = _kek()
    worker_a, worker_b = (Vault(FileKeyStore(tmp_path / "keys"), kek) for _ in range(2))
    await worker_b.seal(TENANT, OWNER, uuid.uuid4(), "before")  # B caches the key
    await worker_a.destroy_owners(TENANT, [OWNER])
    memory_id = uuid.uuid4()
    sealed = await worker_a.seal(TENANT, OWNER, memory_id, "after, under a new key")
    row = _Row(memory_id, sealed.blob, sealed.key_id)
    assert (await worker_b.plaintexts([row]))[memory_id] == "after, under a new key"


async def test_a_key_that_does_not_unwrap_is_an_error_not_an_empty_text(tmp_path: Path) -> None:
    """Red team: a replaced key-encryption key (or a worker with another one) read every sealed
    row as "" - as if erased - and the mention scan skipped them."""
    memory_id = uuid.uuid4()
    sealed = await Vault(FileKeyStore(tmp_path / "keys"), _kek()).seal(
        TENANT, OWNER, memory_id, "still here"
    )
    other = Vault(FileKeyStore(tmp_path / "keys"), _kek())
    with pytest.raises(KeyUnopenable):
        await other.plaintexts([_Row(memory_id, sealed.blob, sealed.key_id)])


async def test_a_destroy_that_crashed_midway_leaves_nothing_to_read_and_is_wiped_later(
    tmp_path: Path,
) -> None:
    """Red team: a crash between overwriting and unlinking left a zeroed key file where fetch
    looks, and every later seal for the owner failed. The key now leaves its name first."""
    store = FileKeyStore(tmp_path / "keys")
    vault = Vault(store, _kek())
    await vault.seal(TENANT, OWNER, uuid.uuid4(), "hers")
    folder = tmp_path / "keys" / str(TENANT)
    # As a crash after the rename leaves it: the key off its name, not yet wiped.
    (folder / f"{OWNER}.key").rename(folder / f".{OWNER}.0123456789abcdef.shred")
    assert await store.fetch(TENANT, OWNER) is None
    fresh = await vault.seal(TENANT, OWNER, uuid.uuid4(), "a new key for new writes")
    assert fresh.key_id != uuid.UUID(int=0)
    await store.destroy(TENANT, OWNER)
    assert sorted(path.name for path in folder.iterdir()) == []
