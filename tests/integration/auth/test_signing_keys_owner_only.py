"""The app's database login cannot add or change token signing keys (review item 5): a key it
could insert was published in the JWKS, and tokens it signed were accepted for any tenant."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from service.__main__ import main
from service.auth.keys import published_jwks
from service.db.session import create_engine
from service.embeddings import Embedder
from service.runtime import build_runtime
from service.settings import Settings
from tests.fixtures.api import Api
from tests.fixtures.postgres import app_login
from tests.integration.auth.forge import (
    assert_token_rejected,
    attacker_key,
    claims_for,
    get_protected,
    sign,
)

_PLANT = (
    "INSERT INTO signing_keys (kid, alg, state, public_jwk, private_key_encrypted) "
    "VALUES ('planted', 'ES256', 'next', CAST(:jwk AS jsonb), '\\x00')"
)


async def _kids(api: Api) -> list[str]:
    response = await api.http.get("/.well-known/jwks.json")
    assert response.status_code == 200
    return [key["kid"] for key in response.json()["keys"]]


async def test_a_planted_key_is_refused_and_its_tokens_do_not_verify(api: Api) -> None:
    alice = await api.new_agent("alice")
    key = attacker_key("planted")
    before = await _kids(api)
    with pytest.raises(DBAPIError) as refused:
        async with api.runtime.engine.begin() as conn:
            await conn.execute(text(_PLANT), {"jwk": json.dumps(key.as_dict(private=False))})
    assert getattr(refused.value.orig, "sqlstate", None) == "42501"  # insufficient_privilege
    assert await _kids(api) == before
    assert "planted" not in before
    api.runtime.embedded_keys.invalidate()
    forged = sign(key, claims_for(api.runtime, alice, api.tenant_id), kid="planted")
    assert_token_rejected(await get_protected(api.http, forged), forged)


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE signing_keys SET public_jwk = '{}'::jsonb",
        "UPDATE signing_keys SET state = 'retired' WHERE state = 'active'",
        "DELETE FROM signing_keys",
        "TRUNCATE signing_keys",
    ],
)
async def test_the_app_role_cannot_change_or_drop_keys(api: Api, statement: str) -> None:
    before = (await api.http.get("/.well-known/jwks.json")).json()
    with pytest.raises(DBAPIError) as refused:
        async with api.runtime.engine.begin() as conn:
            await conn.execute(text(statement))
    assert getattr(refused.value.orig, "sqlstate", None) == "42501"
    assert (await api.http.get("/.well-known/jwks.json")).json() == before
    # The keys still sign: a fresh token works.
    token = await api.access_token(api.admin.client_id, api.admin.secret)
    assert (await get_protected(api.http, token)).status_code == 200


async def test_without_owner_access_a_keyless_service_refuses_to_start(
    settings: Settings, embedder: Embedder
) -> None:
    """The app's login alone cannot make the first keys (the cloned template has none)."""
    with pytest.raises(SystemExit) as refused:
        await build_runtime(settings, app_login(settings.database.url), embedder)
    assert "memgate migrate" in str(refused.value)
    async with owner_connection(settings.database.url) as conn:
        assert (await conn.execute(text("SELECT count(*) FROM signing_keys"))).scalar_one() == 0


async def test_migrate_makes_the_keys_as_the_owner(
    settings: Settings, embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", settings.database.url)
    monkeypatch.setenv("MEMGATE_DATA_DIR", str(settings.database.data_dir))
    monkeypatch.setenv("MEMGATE_KEY_ENCRYPTION_KEY", settings.auth.key_encryption_key)
    assert await asyncio.to_thread(main, ["migrate"]) == 0
    async with owner_connection(settings.database.url) as conn:
        states = (await conn.execute(text("SELECT state FROM signing_keys"))).scalars().all()
    assert sorted(states) == ["active", "next"]
    runtime = await build_runtime(settings, app_login(settings.database.url), embedder)
    try:
        async with runtime.sessionmaker() as session:
            assert len((await published_jwks(session))["keys"]) == 2
    finally:
        await runtime.close()


@asynccontextmanager
async def owner_connection(url: str) -> AsyncIterator[AsyncConnection]:
    engine = create_engine(url, pool_size=1)
    try:
        async with engine.connect() as conn:
            yield conn
    finally:
        await engine.dispose()
