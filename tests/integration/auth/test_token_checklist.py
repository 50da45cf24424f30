"""The access-token checklist: every way a bearer token can be wrong answers 401.

Each forged token differs from one the embedded issuer would issue in exactly one respect; the
control test shows that the same forging path, unchanged, is accepted.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import pytest
from joserfc.jwk import ECKey, OctKey

from service.auth.tokens import TokenRejected
from service.runtime import Runtime
from tests.fixtures.api import Agent, Api, TestClient
from tests.integration.auth.forge import (
    assert_token_rejected,
    attacker_key,
    claims_for,
    embedded_key,
    es256_with_any_header,
    get_protected,
    hs256_with_secret,
    sign,
    unsigned,
)

JUNK_KIDS = (
    "../../etc/passwd",
    "' OR 1=1 --",
    "http://evil/x",
    "..\\..\\windows\\win.ini",
    "'; DROP TABLE signing_keys; --",
    "https://evil.example/jwks.json",
    "file:///etc/shadow",
    "%2e%2e%2f%2e%2e%2fetc%2fpasswd",
    "kid\x00null",
    "${jndi:ldap://evil/a}",
    "{{7*7}}",
    "<script>alert(1)</script>",
    "*",
    "%",
    "_",
    " ",
    "\u202e\u0041",
    "/dev/random",
    "SELECT kid FROM signing_keys",
    "x" * 128,
)


@pytest.fixture
async def alice(api: Api) -> Agent:
    return await api.new_agent("alice")


async def _forge_valid(api: Api, runtime: Runtime, agent: Agent) -> str:
    key = await embedded_key(runtime)
    return sign(key, claims_for(runtime, agent, api.tenant_id))


async def test_control_forged_token_with_real_key_is_accepted(
    api: Api, runtime: Runtime, alice: Agent
) -> None:
    token = await _forge_valid(api, runtime, alice)
    response = await get_protected(api.http, token)
    assert response.status_code == 200, response.text


async def test_missing_bearer_token_is_401(http: TestClient) -> None:
    response = await http.get("/v1/memories")
    assert response.status_code == 401
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.headers["www-authenticate"].startswith("Bearer ")


async def test_alg_none_is_rejected(api: Api, runtime: Runtime, alice: Agent) -> None:
    key = await embedded_key(runtime)
    claims = claims_for(runtime, alice, api.tenant_id)
    for alg in ("none", "None", "NONE"):
        token = unsigned({"alg": alg, "typ": "at+jwt", "kid": key.kid}, claims)
        assert_token_rejected(await get_protected(api.http, token), token)


async def test_hs256_keyed_with_public_key_bytes_is_rejected(
    api: Api, runtime: Runtime, alice: Agent
) -> None:
    key = await embedded_key(runtime)
    claims = claims_for(runtime, alice, api.tenant_id)
    header = {"alg": "HS256", "typ": "at+jwt", "kid": key.kid}
    public_pem = key.as_pem(private=False)
    public_jwk_json = json.dumps(key.as_dict(private=False)).encode()
    for secret in (public_pem, public_pem.strip(), public_jwk_json):
        token = hs256_with_secret(header, claims, secret)
        assert_token_rejected(await get_protected(api.http, token), token)


async def test_hs256_with_oct_key_and_real_kid_is_rejected(
    api: Api, runtime: Runtime, alice: Agent
) -> None:
    key = await embedded_key(runtime)
    oct_key = OctKey.generate_key(256)
    token = sign(oct_key, claims_for(runtime, alice, api.tenant_id), alg="HS256", kid=key.kid)
    assert_token_rejected(await get_protected(api.http, token), token)


async def test_unknown_kid_is_rejected(api: Api, runtime: Runtime, alice: Agent) -> None:
    real = await embedded_key(runtime)
    claims = claims_for(runtime, alice, api.tenant_id)
    # Signed by the real key but naming a kid nobody published.
    by_real_key = sign(real, claims, kid="20990101-deadbeef")
    assert_token_rejected(await get_protected(api.http, by_real_key), by_real_key)
    # Signed by a stranger's key under its own kid.
    stranger = attacker_key("stranger-kid")
    by_stranger = sign(stranger, claims)
    assert_token_rejected(await get_protected(api.http, by_stranger), by_stranger)
    # Signed by a stranger's key under the real kid: the signature does not verify.
    impostor = sign(stranger, claims, kid=real.kid)
    assert_token_rejected(await get_protected(api.http, impostor), impostor)


async def test_missing_oversized_or_non_string_kid_is_rejected(
    api: Api, runtime: Runtime, alice: Agent
) -> None:
    real = await embedded_key(runtime)
    claims = claims_for(runtime, alice, api.tenant_id)
    headers: list[dict[str, object]] = [
        {"alg": "ES256", "typ": "at+jwt"},
        {"alg": "ES256", "typ": "at+jwt", "kid": ""},
        {"alg": "ES256", "typ": "at+jwt", "kid": "x" * 129},
        {"alg": "ES256", "typ": "at+jwt", "kid": f"{real.kid}{'x' * 200}"},
    ]
    headers += [
        {"alg": "ES256", "typ": "at+jwt", "kid": odd}
        for odd in (123, ["a"], [real.kid], {"kid": real.kid}, None, True)
    ]
    assert isinstance(real, ECKey)
    control = es256_with_any_header(
        {"alg": "ES256", "typ": "at+jwt", "kid": real.kid}, claims, real
    )
    assert (await get_protected(api.http, control)).status_code == 200
    for header in headers:
        token = es256_with_any_header(header, claims, real)
        assert_token_rejected(await get_protected(api.http, token), token)


async def test_junk_kids_are_rejected_and_refetch_at_most_once(
    api: Api, runtime: Runtime, alice: Agent
) -> None:
    real = await embedded_key(runtime)
    claims = claims_for(runtime, alice, api.tenant_id)
    before = runtime.embedded_keys.fetch_count
    for kid in JUNK_KIDS:
        token = sign(real, claims, kid=kid)
        response = await get_protected(api.http, token)
        assert_token_rejected(response, token)
        if len(kid) >= 4:
            assert kid not in response.text  # nothing of the header is reflected either
    assert len(JUNK_KIDS) == 20
    assert runtime.embedded_keys.fetch_count - before <= 1
    # The cache still serves the real key afterwards, without another fetch.
    after_flood = runtime.embedded_keys.fetch_count
    good = sign(real, claims)
    assert (await get_protected(api.http, good)).status_code == 200
    assert runtime.embedded_keys.fetch_count == after_flood


async def test_junk_kid_flood_after_invalidate_refetches_at_most_once(
    api: Api, runtime: Runtime, alice: Agent
) -> None:
    real = await embedded_key(runtime)
    claims = claims_for(runtime, alice, api.tenant_id)
    assert (await get_protected(api.http, sign(real, claims))).status_code == 200
    runtime.embedded_keys.invalidate()  # what a rotation in this process does
    before = runtime.embedded_keys.fetch_count
    for kid in JUNK_KIDS:
        token = sign(real, claims, kid=kid)
        assert_token_rejected(await get_protected(api.http, token), token)
    assert runtime.embedded_keys.fetch_count - before <= 1


async def test_concurrent_junk_kid_flood_on_a_cold_cache_fetches_once(runtime: Runtime) -> None:
    """Twenty junk-kid tokens arriving together before any key was loaded: one fetch (single
    flight), not one per request. Calls the real verifier directly, since the test client
    serialises HTTP requests; no request has warmed the cache in this test."""
    real = await embedded_key(runtime)
    nobody = Agent(str(uuid.uuid4()), str(uuid.uuid4()), "", "")
    claims = claims_for(runtime, nobody, str(uuid.uuid4()))
    assert runtime.embedded_keys.fetch_count == 0
    tokens = [sign(real, claims, kid=kid) for kid in JUNK_KIDS]
    results = await asyncio.gather(
        *(runtime.verifier.verify(token) for token in tokens), return_exceptions=True
    )
    assert all(isinstance(result, TokenRejected) for result in results), results
    assert runtime.embedded_keys.fetch_count <= 1
    # and the cache did load the real keys: a token under the real kid verifies
    verified = await runtime.verifier.verify(sign(real, claims))
    assert verified.subject == nobody.principal_id
    assert runtime.embedded_keys.fetch_count <= 1


async def test_wrong_issuer_is_rejected(api: Api, runtime: Runtime, alice: Agent) -> None:
    key = await embedded_key(runtime)
    public_url = runtime.settings.server.public_url
    for iss in (
        "http://evil.example",
        public_url + "/",
        public_url.upper(),
        "",
        [public_url],
        {"iss": public_url},
        42,
    ):
        token = sign(key, claims_for(runtime, alice, api.tenant_id, iss=iss))
        assert_token_rejected(await get_protected(api.http, token), token)
    missing = sign(key, claims_for(runtime, alice, api.tenant_id, iss=None))
    assert_token_rejected(await get_protected(api.http, missing), missing)


async def test_missing_audience_is_rejected(api: Api, runtime: Runtime, alice: Agent) -> None:
    key = await embedded_key(runtime)
    token = sign(key, claims_for(runtime, alice, api.tenant_id, aud=None))
    assert_token_rejected(await get_protected(api.http, token), token)


async def test_wrong_audience_is_rejected(api: Api, runtime: Runtime, alice: Agent) -> None:
    key = await embedded_key(runtime)
    for aud in ("other-api", "memgate ", "MEMGATE", ["other-api"], [], ""):
        token = sign(key, claims_for(runtime, alice, api.tenant_id, aud=aud))
        assert_token_rejected(await get_protected(api.http, token), token)


async def test_audience_must_be_exactly_ours(api: Api, runtime: Runtime, alice: Agent) -> None:
    """Review item 9: `aud` is our audience as a string, or a list holding only it. A token
    also meant for another API is refused: that API could replay it here."""
    key = await embedded_key(runtime)
    for aud in (
        ["other-api", "memgate"],
        ["memgate", "other-api"],
        ["memgate", "memgate"],
        [["memgate"]],
        {"memgate": True},
    ):
        token = sign(key, claims_for(runtime, alice, api.tenant_id, aud=aud))
        assert_token_rejected(await get_protected(api.http, token), token)
    for accepted in ("memgate", ["memgate"]):
        token = sign(key, claims_for(runtime, alice, api.tenant_id, aud=accepted))
        response = await get_protected(api.http, token)
        assert response.status_code == 200, (accepted, response.text)


async def test_expiry_honours_the_leeway(api: Api, runtime: Runtime, alice: Agent) -> None:
    assert runtime.settings.auth.leeway_seconds == 30
    key = await embedded_key(runtime)
    now = int(time.time())
    within = sign(key, claims_for(runtime, alice, api.tenant_id, now=now - 610, lifetime=600))
    response = await get_protected(api.http, within)
    assert response.status_code == 200, response.text
    beyond = sign(key, claims_for(runtime, alice, api.tenant_id, now=now - 700, lifetime=600))
    assert_token_rejected(await get_protected(api.http, beyond), beyond)


async def test_missing_expiry_or_issued_at_is_rejected(
    api: Api, runtime: Runtime, alice: Agent
) -> None:
    key = await embedded_key(runtime)
    for dropped in ("exp", "iat", "jti", "sub"):
        claims = claims_for(runtime, alice, api.tenant_id)
        del claims[dropped]
        token = sign(key, claims)
        assert_token_rejected(await get_protected(api.http, token), token)
    odd_values: tuple[tuple[str, object], ...] = (
        ("exp", "9999999999"),
        ("exp", True),
        ("exp", 1e400),  # JSON Infinity
        ("iat", "0"),
        ("nbf", "0"),
    )
    for name, odd in odd_values:
        claims = claims_for(runtime, alice, api.tenant_id)
        claims[name] = odd
        token = sign(key, claims)
        assert_token_rejected(await get_protected(api.http, token), token)


async def test_not_before_in_the_future_is_rejected(
    api: Api, runtime: Runtime, alice: Agent
) -> None:
    key = await embedded_key(runtime)
    now = int(time.time())
    within = sign(key, claims_for(runtime, alice, api.tenant_id, nbf=now + 10))
    assert (await get_protected(api.http, within)).status_code == 200
    beyond = sign(key, claims_for(runtime, alice, api.tenant_id, nbf=now + 120))
    assert_token_rejected(await get_protected(api.http, beyond), beyond)


async def test_issued_in_the_future_is_rejected(api: Api, runtime: Runtime, alice: Agent) -> None:
    key = await embedded_key(runtime)
    later = int(time.time()) + 600
    token = sign(key, claims_for(runtime, alice, api.tenant_id, now=later, nbf=None))
    assert_token_rejected(await get_protected(api.http, token), token)


async def test_typ_must_be_at_jwt(api: Api, runtime: Runtime, alice: Agent) -> None:
    key = await embedded_key(runtime)
    claims = claims_for(runtime, alice, api.tenant_id)
    for typ in ("JWT", "jwt", "id_token+jwt", "at+jwt+x", None):
        token = sign(key, claims, typ=typ)
        assert_token_rejected(await get_protected(api.http, token), token)
    for accepted in ("at+jwt", "AT+JWT", "application/at+jwt"):
        token = sign(key, claims, typ=accepted)
        assert (await get_protected(api.http, token)).status_code == 200, accepted


async def test_lifetime_beyond_max_ttl_is_rejected(
    api: Api, runtime: Runtime, alice: Agent
) -> None:
    max_ttl = runtime.settings.auth.max_token_ttl_seconds
    assert max_ttl == 3600
    key = await embedded_key(runtime)
    now = int(time.time()) - 10
    at_max = sign(key, claims_for(runtime, alice, api.tenant_id, now=now, lifetime=max_ttl))
    assert (await get_protected(api.http, at_max)).status_code == 200
    for lifetime in (max_ttl + 1, 86_400, 10 * 365 * 86_400):
        token = sign(key, claims_for(runtime, alice, api.tenant_id, now=now, lifetime=lifetime))
        assert_token_rejected(await get_protected(api.http, token), token)


async def test_embedded_jwk_header_key_is_not_trusted(
    api: Api, runtime: Runtime, alice: Agent
) -> None:
    real = await embedded_key(runtime)
    claims = claims_for(runtime, alice, api.tenant_id)
    evil = attacker_key("evil-kid")
    public = evil.as_dict(private=False)
    for kid in ("evil-kid", real.kid):
        token = sign(evil, claims, kid=kid, jwk=public)
        assert_token_rejected(await get_protected(api.http, token), token)


async def test_jku_and_x5u_headers_are_not_followed(
    api: Api, runtime: Runtime, alice: Agent
) -> None:
    real = await embedded_key(runtime)
    claims = claims_for(runtime, alice, api.tenant_id)
    evil = attacker_key("evil-kid")
    for kid in ("evil-kid", real.kid):
        with_jku = sign(evil, claims, kid=kid, jku="http://127.0.0.1:9/jwks.json")
        assert_token_rejected(await get_protected(api.http, with_jku), with_jku)
        with_x5u = sign(evil, claims, kid=kid, x5u="http://127.0.0.1:9/cert.pem")
        assert_token_rejected(await get_protected(api.http, with_x5u), with_x5u)


async def test_tenant_claim_swapped_to_another_tenant_is_rejected(
    api: Api, runtime: Runtime, alice: Agent
) -> None:
    globex = await api.other_tenant("globex")
    bob = await globex.new_agent("bob")
    key = await embedded_key(runtime)
    # alice's principal and client, but globex's tenant id
    swapped = sign(key, claims_for(runtime, alice, globex.tenant_id))
    assert_token_rejected(await get_protected(api.http, swapped), swapped)
    # bob's principal and client (globex), but acme's tenant id
    foreign = sign(key, claims_for(runtime, bob, api.tenant_id))
    assert_token_rejected(await get_protected(api.http, foreign), foreign)
    # bob's principal with alice's client, both claiming acme
    mixed = Agent(bob.principal_id, alice.client_id, "", "")
    crossed = sign(key, claims_for(runtime, mixed, api.tenant_id))
    assert_token_rejected(await get_protected(api.http, crossed), crossed)
    # a random tenant, and one that is not a UUID
    for tenant in (str(uuid.uuid4()), "acme", "' OR 1=1 --"):
        token = sign(key, claims_for(runtime, alice, tenant))
        assert_token_rejected(await get_protected(api.http, token), token)
    # bob's own token still works in globex: the rejections above are about the swap
    assert (await get_protected(api.http, bob.token)).status_code == 200


async def test_malformed_tokens_are_rejected(api: Api) -> None:
    for token in (
        "not-a-jwt",
        "a.b.c",
        "a.b.c.d.e",
        "eyJhbGciOiJFUzI1NiJ9.eyJpc3MiOiJ4In0",
        "x" * 9000,
        "eyJhbGciOiJFUzI1NiJ9.W10.c2ln",  # payload is a JSON array
    ):
        assert_token_rejected(await get_protected(api.http, token), token)
