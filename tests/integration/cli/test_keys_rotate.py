"""`memgate keys rotate` against a running app's database: the promoted key was published
before it signed, so tokens from both keys verify without a refetch."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from service.__main__ import main
from service.audit.checkpoints import run_checkpoints
from service.auth.tokens import CachedKeySet
from service.runtime import Runtime
from tests.fixtures.api import Api
from tests.integration.audit.support import auditor_get
from tests.integration.auth.forge import get_protected, unverified_header


async def test_keys_rotate_command(
    api: Api, runtime: Runtime, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    alice = await api.new_agent("alice")
    before = await api.http.get("/.well-known/jwks.json")
    assert len(before.json()["keys"]) == 2  # active + next
    old_kid = unverified_header(alice.token)["kid"]

    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("MEMGATE_DATA_DIR", str(tmp_path / "cli"))
    monkeypatch.setenv("MEMGATE_KEY_ENCRYPTION_KEY", runtime.settings.auth.key_encryption_key)
    assert await asyncio.to_thread(main, ["keys", "rotate"]) == 0

    after = await api.http.get("/.well-known/jwks.json")
    assert len(after.json()["keys"]) == 3  # retired + active + a fresh next
    keys: CachedKeySet = runtime.embedded_keys
    fetches = keys.fetch_count
    fresh = await api.access_token(alice.client_id, alice.secret)
    new_kid = unverified_header(fresh)["kid"]
    assert new_kid != old_kid
    assert (await get_protected(api.http, fresh)).status_code == 200
    assert (await get_protected(api.http, alice.token)).status_code == 200
    assert keys.fetch_count == fetches  # the new active key was already known as `next`


async def test_keys_rotate_audit_command(
    api: Api, runtime: Runtime, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The owner retires the audit key and makes a fresh one; checkpoints the old key signed
    still verify (it stays published), new ones are signed with the new key."""
    await api.new_agent("alice")
    assert await run_checkpoints(runtime.sessionmaker, runtime.kek) >= 1
    (old_kid,) = [key["kid"] for key in (await auditor_get(api, "/v1/audit/keys")).json()["keys"]]

    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("MEMGATE_DATA_DIR", str(tmp_path / "cli"))
    monkeypatch.setenv("MEMGATE_KEY_ENCRYPTION_KEY", runtime.settings.auth.key_encryption_key)
    assert await asyncio.to_thread(main, ["keys", "rotate-audit"]) == 0

    kids = [key["kid"] for key in (await auditor_get(api, "/v1/audit/keys")).json()["keys"]]
    assert len(kids) == 2
    assert kids[0] == old_kid
    assert await run_checkpoints(runtime.sessionmaker, runtime.kek) >= 1
    latest = (await auditor_get(api, "/v1/audit/checkpoints/latest")).json()
    assert latest["kid"] == kids[1] != old_kid
    report = (await auditor_get(api, "/v1/audit/verify")).json()
    assert (report["ok"], report["unsigned_checkpoints"]) == (True, [])
