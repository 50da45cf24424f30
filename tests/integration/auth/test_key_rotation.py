"""Rotating the embedded issuer's signing keys: old tokens keep verifying, new tokens carry the
new kid, and the JWKS publishes both."""

from __future__ import annotations

from service.runtime import Runtime
from tests.fixtures.api import Api
from tests.integration.auth.forge import get_protected, unverified_header


async def _published_kids(api: Api) -> list[str]:
    response = await api.http.get("/.well-known/jwks.json")
    assert response.status_code == 200
    return [key["kid"] for key in response.json()["keys"]]


async def test_rotation_keeps_old_tokens_and_signs_new_ones_with_the_new_kid(
    api: Api, runtime: Runtime
) -> None:
    alice = await api.new_agent("alice")
    old_token = alice.token
    old_kid = unverified_header(old_token)["kid"]
    assert (await get_protected(api.http, old_token)).status_code == 200
    kids_before = await _published_kids(api)
    assert old_kid in kids_before

    new_kid = await runtime.rotate_signing_keys(runtime.settings.database.url)
    assert new_kid != old_kid
    # The promoted key was published (as `next`) before it ever signed.
    assert new_kid in kids_before

    new_token = await api.access_token(alice.client_id, alice.secret)
    assert unverified_header(new_token)["kid"] == new_kid

    assert (await get_protected(api.http, old_token)).status_code == 200
    assert (await get_protected(api.http, new_token)).status_code == 200

    kids_after = await _published_kids(api)
    assert old_kid in kids_after
    assert new_kid in kids_after
    assert len(kids_after) == 3  # retired, active, next


async def test_two_rotations_still_verify_tokens_of_every_unexpired_key(
    api: Api, runtime: Runtime
) -> None:
    alice = await api.new_agent("alice")
    tokens = [alice.token]
    for _ in range(2):
        await runtime.rotate_signing_keys(runtime.settings.database.url)
        tokens.append(await api.access_token(alice.client_id, alice.secret))
    kids = [unverified_header(token)["kid"] for token in tokens]
    assert len(set(kids)) == 3
    published = await _published_kids(api)
    for token, kid in zip(tokens, kids, strict=True):
        assert kid in published
        assert (await get_protected(api.http, token)).status_code == 200, kid
