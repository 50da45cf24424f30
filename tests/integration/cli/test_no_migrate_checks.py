"""What `serve --no-migrate` checks as the app's login before it listens, one missing piece of
the owner's work at a time: a schema behind head, no signing key, no audit key this
key-encryption key opens, no bootstrap tenant. Each refusal names `memgate migrate`."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.__main__ import NotMigrated, _bootstrap_as_app, _ready_without_owner
from service.auth.keys import KeyEncryptionKey
from service.db.migrate import head_revision
from service.runtime import as_owner, provision_audit_key, provision_signing_keys
from service.settings import Settings
from tests.fixtures.postgres import app_login


def _refused(settings: Settings, url: str) -> str:
    with pytest.raises(NotMigrated) as refused:
        _ready_without_owner(settings, url)
    message = str(refused.value.code)
    assert message.startswith("memgate serve --no-migrate: ")
    assert "run `memgate migrate` first" in message
    return message


async def test_each_missing_piece_of_owner_work_is_refused_until_migrate_did_it(
    settings: Settings, owner_engine: AsyncEngine
) -> None:
    owner, url = settings.database.url, app_login(settings.database.url)
    kek = KeyEncryptionKey.from_setting_or_file(
        settings.auth.key_encryption_key, settings.database.data_dir
    )
    head = head_revision()
    async with owner_engine.begin() as conn:
        await conn.execute(text("UPDATE alembic_version SET version_num = 'older'"))
    message = await asyncio.to_thread(_refused, settings, url)
    assert f"the schema is at older, this memgate needs {head}" in message
    async with owner_engine.begin() as conn:
        await conn.execute(text("UPDATE alembic_version SET version_num = :h"), {"h": head})

    message = await asyncio.to_thread(_refused, settings, url)
    assert "the embedded issuer has no signing key" in message
    await as_owner(owner, lambda s: provision_signing_keys(settings, s, kek))
    message = await asyncio.to_thread(_refused, settings, url)
    assert "no audit signing key this MEMGATE_KEY_ENCRYPTION_KEY opens" in message
    await as_owner(owner, lambda s: provision_audit_key(s, kek))
    message = await asyncio.to_thread(_refused, settings, url)
    assert "no tenant was bootstrapped" in message

    admin = await _bootstrap_as_app(settings, url)
    assert admin is not None
    assert await asyncio.to_thread(_ready_without_owner, settings, url) == admin
