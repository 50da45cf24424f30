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
    # Another key-encryption key cannot unwrap the owner's data key.
    stranger = Vault(FileKeyStore(tmp_path / "keys"), _kek())
    with pytest.raises(KeyDestroyed):
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
