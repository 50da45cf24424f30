"""The app's database login cannot add or change token signing keys (review item 5): a key it
could insert was published in the JWKS, and tokens it signed were accepted for any tenant."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from tests.fixtures.api import Api
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
