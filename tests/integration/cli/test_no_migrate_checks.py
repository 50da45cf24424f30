"""What `serve --no-migrate` checks as the app's login before it listens, one missing piece of
the owner's work at a time: a schema behind head, no signing key, no audit key this
key-encryption key opens, no bootstrap tenant. Each refusal names `memgate migrate`."""

from __future__ import annotations

import asyncio
import base64
import os
from dataclasses import replace

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.__main__ import NotMigrated, _bootstrap_as_app, _ready_without_owner
from service.auth.keys import KeyEncryptionKey, WrongKeyEncryptionKey
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


async def test_a_second_key_encryption_key_is_refused_by_migrate_and_serve(
    settings: Settings, owner_engine: AsyncEngine
) -> None:
    """The red team's case: `migrate` with key A, again with key B, then `serve --no-migrate`
    with B started (ready) and every token request failed 500: migrate had added an audit key
    B opens and the check saw only that a signing key exists. Now both refuse, and B adds no key
    beside A's."""
    owner, url = settings.database.url, app_login(settings.database.url)
    first = KeyEncryptionKey.from_setting_or_file(
        settings.auth.key_encryption_key, settings.database.data_dir
    )
    await as_owner(owner, lambda s: provision_signing_keys(settings, s, first))
    await as_owner(owner, lambda s: provision_audit_key(s, first))
    assert await _bootstrap_as_app(settings, url) is not None
    counted = (
        "SELECT (SELECT count(*) FROM signing_keys), (SELECT count(*) FROM audit_signing_keys)"
    )
    async with owner_engine.connect() as conn:
        before = (await conn.execute(text(counted))).one()

    other_key = base64.urlsafe_b64encode(os.urandom(32)).decode()
    other = replace(settings, auth=replace(settings.auth, key_encryption_key=other_key))
    second = KeyEncryptionKey.from_setting_or_file(other_key, settings.database.data_dir)
    with pytest.raises(WrongKeyEncryptionKey, match="the active and next token signing keys"):
        await as_owner(owner, lambda s: provision_signing_keys(other, s, second))
    with pytest.raises(WrongKeyEncryptionKey, match="unretired audit signing key"):
        await as_owner(owner, lambda s: provision_audit_key(s, second))
    async with owner_engine.connect() as conn:
        assert (await conn.execute(text(counted))).one() == before
    message = await asyncio.to_thread(_refused, other, url)
    assert "the active and next token signing keys cannot be opened" in message
    # the first key still serves
    assert await asyncio.to_thread(_ready_without_owner, settings, url) is not None
