"""Crypto-shredding: memory text sealed under per-owner data keys kept outside PostgreSQL."""

from service.shredding.keystore import (
    DataKeyStore,
    FileKeyStore,
    KeyStoreUnavailable,
    StoredKey,
    key_store_from,
)
from service.shredding.vault import (
    KeyDestroyed,
    KeyUnopenable,
    Sealed,
    Vault,
    key_slot,
    opened_value,
    vault_of,
)

__all__ = [
    "DataKeyStore",
    "FileKeyStore",
    "KeyDestroyed",
    "KeyStoreUnavailable",
    "KeyUnopenable",
    "Sealed",
    "StoredKey",
    "Vault",
    "key_slot",
    "key_store_from",
    "opened_value",
    "vault_of",
]
