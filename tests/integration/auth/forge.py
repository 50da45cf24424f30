"""Helpers to mint and forge access tokens with joserfc, and to check a 401 answer.

Forged tokens are signed for real (the embedded signing key, or keys generated here); nothing in
the verifier is mocked. `claims_for` builds the claims the embedded issuer itself would put in a
token, so each negative test differs from a valid token in exactly one respect.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
import uuid
from typing import Any

import httpx
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from joserfc import jwt
from joserfc.jwk import ECKey, OctKey, RSAKey

from service.auth.keys import SigningJwk, active_signing_key
from service.problems import PROBLEM_TYPES
from service.runtime import Runtime
from tests.fixtures.api import Agent

PROTECTED = "/v1/memories"

AnyKey = ECKey | RSAKey | OctKey | SigningJwk


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_json(value: object) -> str:
    return b64url(json.dumps(value, separators=(",", ":")).encode())


def segments(token: str) -> list[str]:
    return token.split(".")


def unverified_header(token: str) -> dict[str, Any]:
    head = segments(token)[0]
    header: dict[str, Any] = json.loads(base64.urlsafe_b64decode(head + "=" * (-len(head) % 4)))
    return header


async def embedded_key(runtime: Runtime) -> SigningJwk:
    """The embedded issuer's real, currently active private signing key."""
    async with runtime.sessionmaker() as session:
        return await active_signing_key(session, runtime.kek)


def claims_for(
    runtime: Runtime,
    agent: Agent,
    tenant_id: str,
    *,
    scope: str = "read:memory write:memory",
    lifetime: int = 600,
    now: int | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    """The claims the embedded issuer would issue to `agent`; `overrides` replace or (with the
    value `None`) drop single claims."""
    issued = int(time.time()) if now is None else now
    claims: dict[str, Any] = {
        "iss": runtime.settings.server.public_url,
        "aud": runtime.settings.auth.audience,
        "sub": agent.principal_id,
        "tenant": tenant_id,
        "client_id": agent.client_id,
        "scope": scope,
        "jti": uuid.uuid4().hex,
        "iat": issued,
        "nbf": issued,
        "exp": issued + lifetime,
    }
    return with_overrides(claims, overrides)


def with_overrides(claims: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Claims with some replaced; an override of None removes the claim."""
    changed = dict(claims)
    for name, value in overrides.items():
        if value is None:
            changed.pop(name, None)
        else:
            changed[name] = value
    return changed


def sign(
    key: AnyKey,
    claims: dict[str, Any],
    *,
    alg: str = "ES256",
    kid: str | None = None,
    typ: str | None = "at+jwt",
    **header_extra: Any,
) -> str:
    """A compact JWS signed for real with `key` (joserfc `jwt.encode`)."""
    header: dict[str, Any] = {"alg": alg}
    if typ is not None:
        header["typ"] = typ
    chosen_kid = kid if kid is not None else key.kid
    if chosen_kid is not None:
        header["kid"] = chosen_kid
    header.update(header_extra)
    return jwt.encode(header, claims, key, algorithms=[alg])


def unsigned(header: dict[str, Any], claims: dict[str, Any]) -> str:
    """`alg: none`: header and claims, empty signature."""
    return f"{b64url_json(header)}.{b64url_json(claims)}."


def hs256_with_secret(header: dict[str, Any], claims: dict[str, Any], secret: bytes) -> str:
    """Hand-rolled HS256, for the classic confusion attack (HMAC keyed with the public key bytes,
    which joserfc itself refuses to import as an oct key)."""
    signing_input = f"{b64url_json(header)}.{b64url_json(claims)}"
    mac = hmac.new(secret, signing_input.encode("ascii"), hashlib.sha256).digest()
    return f"{signing_input}.{b64url(mac)}"


def es256_with_any_header(header: dict[str, Any], claims: dict[str, Any], key: ECKey) -> str:
    """A real ES256 signature over a header joserfc would refuse to build (e.g. a non-string
    `kid`), made with `cryptography` directly."""
    private = key.private_key
    assert isinstance(private, ec.EllipticCurvePrivateKey)
    signing_input = f"{b64url_json(header)}.{b64url_json(claims)}"
    der = private.sign(signing_input.encode("ascii"), ec.ECDSA(hashes.SHA256()))
    r, s = decode_dss_signature(der)
    return f"{signing_input}.{b64url(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"


def attacker_key(kid: str = "attacker-key") -> ECKey:
    return ECKey.generate_key("P-256", parameters={"kid": kid, "alg": "ES256", "use": "sig"})


def assert_token_rejected(response: httpx.Response, token: str) -> None:
    """401, RFC 9457 body, a Bearer challenge, and no trace of the token in what comes back."""
    assert response.status_code == 401, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    challenge = response.headers.get("www-authenticate", "")
    assert challenge.startswith("Bearer "), challenge
    body = response.json()
    assert body["status"] == 401
    detail = str(body.get("detail", ""))
    assert detail
    assert token not in response.text
    for part in segments(token):
        if len(part) >= 8:
            assert part not in detail
            assert part not in response.text


async def get_protected(http: Any, token: str) -> httpx.Response:
    response: httpx.Response = await http.get(
        PROTECTED, headers={"Authorization": f"Bearer {token}"}
    )
    return response


def assert_oauth_error(response: httpx.Response, status: int, error: str, secret: str = "") -> None:
    """A token-endpoint refusal: RFC 6749 `error` and RFC 9457 members, never cached, and the
    presented secret nowhere in the answer."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body = response.json()
    assert body["error"] == error
    assert body["status"] == status
    assert body["error_description"]
    # A declared problem type, listed in openapi.yaml like every other.
    assert PROBLEM_TYPES[body["type"].rsplit("/", 1)[-1]].status == status
    assert "access_token" not in body
    if secret:
        assert secret not in response.text
    assert response.headers.get("cache-control") == "no-store"
