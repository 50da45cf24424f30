"""The embedded authorization server: OAuth 2 client credentials on authlib's grant machinery.

authlib's core is synchronous, so the async parts run first and the grant runs against
preloaded values. The order bounds what an unauthenticated request can hold (review item 1):
the client row is read in a short session of its own, whose connection goes back to the pool
*before* the request queues for one of the two argon2 slots; only a client whose secret matched
reads the signing key (in the request's transaction) and reaches authlib, which compares the
presented secret with the one already verified instead of hashing again.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import anyio
from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from authlib.oauth2 import AuthorizationServer, OAuth2Request
from authlib.oauth2.rfc6749 import ClientMixin, grants
from authlib.oauth2.rfc6749.errors import InvalidScopeError
from authlib.oauth2.rfc6749.requests import BasicOAuth2Payload
from joserfc import jwt
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.auth.keys import KeyEncryptionKey, SigningJwk, active_signing_key
from service.auth.scopes import ADMIN_SCOPES

# Client secrets are 256 random bits, so the hash only has to make a leaked table useless, not
# slow down guessing. OWASP's argon2id minimum (19 MiB, t=2, p=1) keeps one verification near
# 20 ms and 19 MiB instead of the library default's 64 MiB, and at most two run at once.
_hasher = PasswordHasher(time_cost=2, memory_cost=19_456, parallelism=1)
GRANTS_AT_ONCE = anyio.CapacityLimiter(2)
# Pool connections client lookups of token requests may hold at once: a lookup takes a few ms
# and the hash ~20 ms, so two keep the slots busy while a burst of token requests cannot take
# the connections other tenants' calls need.
LOOKUPS_AT_ONCE = anyio.CapacityLimiter(2)
# Verified when the client id is unknown, so a miss costs as long as a wrong secret.
_DUMMY_HASH = _hasher.hash(uuid.uuid4().hex)


def hash_secret(secret: str) -> str:
    return _hasher.hash(secret)


async def hash_secret_off_loop(secret: str) -> str:
    result: str = await anyio.to_thread.run_sync(hash_secret, secret, limiter=GRANTS_AT_ONCE)
    return result


def verify_secret(secret_hash: str, secret: str) -> bool:
    try:
        return _hasher.verify(secret_hash, secret)
    except (VerificationError, InvalidHashError):
        return False


@dataclass(frozen=True)
class IssuerConfig:
    issuer: str
    audience: str
    ttl_seconds: int


@dataclass
class RegisteredClient(ClientMixin):  # type: ignore[misc]
    """A client row as authlib sees it (preloaded; no database access inside the grant)."""

    client_id: str
    tenant_id: uuid.UUID
    principal_id: uuid.UUID
    kind: str
    secret_hash: str
    allowed_scopes: frozenset[str]
    verified_secret: str | None = None
    """The secret `authenticate` verified against the hash (None: none matched)."""

    def get_client_id(self) -> str:
        return self.client_id

    def check_client_secret(self, client_secret: str) -> bool:
        """authlib's check: the presented secret is the one already verified off the loop."""
        if self.verified_secret is None:
            return False
        return hmac.compare_digest(client_secret.encode(), self.verified_secret.encode())

    def check_endpoint_auth_method(self, method: str, endpoint: str) -> bool:
        return method in {"client_secret_basic", "client_secret_post"}

    def check_grant_type(self, grant_type: str) -> bool:
        return grant_type == "client_credentials"

    def get_allowed_scope(self, scope: str) -> str:
        """Requested ∩ registered, and never an admin scope for an agent client. No scope asked
        means everything the client is registered for."""
        requested = set(scope.split()) if scope else set(self.allowed_scopes)
        granted = requested & self.allowed_scopes
        if self.kind != "admin":
            granted -= ADMIN_SCOPES
        return " ".join(sorted(granted))


def unknown_client(client_id: str) -> RegisteredClient:
    return RegisteredClient(
        client_id=client_id,
        tenant_id=uuid.UUID(int=0),
        principal_id=uuid.UUID(int=0),
        kind="agent",
        secret_hash=_DUMMY_HASH,
        allowed_scopes=frozenset(),
    )


class _ClientCredentials(grants.ClientCredentialsGrant):  # type: ignore[misc]
    TOKEN_ENDPOINT_AUTH_METHODS = ["client_secret_basic", "client_secret_post"]


class _FormRequest(OAuth2Request):  # type: ignore[misc]
    def __init__(self, uri: str, form: dict[str, str], headers: dict[str, str]) -> None:
        super().__init__("POST", uri, headers=headers)
        self.payload = BasicOAuth2Payload(form)
        self._form = form

    @property
    def form(self) -> dict[str, str]:
        return self._form


class _Server(AuthorizationServer):  # type: ignore[misc]
    def __init__(self, client: RegisteredClient | None) -> None:
        super().__init__()
        self._client = client
        self.register_grant(_ClientCredentials)

    def query_client(self, client_id: str) -> RegisteredClient:
        """Unknown, disabled and other ids get a stand-in whose secret never matches, so every
        failure takes the same path, status, words and argon2 cost: the endpoint does not tell
        which client ids exist."""
        if self._client is not None and self._client.client_id == client_id:
            return self._client
        return unknown_client(client_id)

    def create_oauth2_request(self, request: OAuth2Request) -> OAuth2Request:
        return request

    def save_token(self, token: dict[str, Any], request: OAuth2Request) -> None:
        """Access tokens are self-contained JWTs; nothing to store."""

    def send_signal(self, name: str, *args: Any, **kwargs: Any) -> None:
        """No signal bus here; auditing happens around the endpoint."""

    def handle_response(
        self, status: int, body: dict[str, Any], headers: list[tuple[str, str]]
    ) -> tuple[int, dict[str, Any], list[tuple[str, str]]]:
        return status, body, headers


OAuthAnswer = tuple[int, dict[str, Any], list[tuple[str, str]]]


def refusal(status: int, error: str, description: str) -> OAuthAnswer:
    headers = [("WWW-Authenticate", 'Basic realm="memgate"')] if status == 401 else []
    return status, {"error": error, "error_description": description}, headers


def basic_secret(token: str) -> str | None:
    """The secret of an HTTP Basic credential (already checked by `check_request`)."""
    try:
        decoded = base64.b64decode(token, validate=True).decode()
    except (ValueError, UnicodeDecodeError):
        return None
    _, separator, secret = decoded.partition(":")
    return unquote(secret) if separator else None


def _basic_credentials(token: str) -> str | None:
    """The client id of an HTTP Basic credential; None if it is not strict base64 of
    UTF-8 `id:secret`."""
    try:
        decoded = base64.b64decode(token, validate=True).decode()
    except (ValueError, UnicodeDecodeError):
        return None
    user, separator, _ = decoded.partition(":")
    return unquote(user) if separator and user else None


@dataclass(frozen=True)
class TokenRequest:
    form: dict[str, str]
    client_id: str | None
    authorization: str
    """What authlib gets to read: a canonical `Basic <token>` this code has validated, or ""."""


def check_request(
    content_type: str, items: list[tuple[str, str]], authorization: str
) -> TokenRequest | OAuthAnswer:
    """RFC 6749's request rules that authlib leaves to the framework: a form body, each
    parameter once (§3.1), one client authentication method (§2.3). Returns the form, the
    client id and the canonical Authorization header, or the refusal. The header is parsed the
    way authlib would (scheme, any whitespace, token), and authlib only ever sees the canonical
    form of what was checked here."""
    media_type = content_type.split(";", maxsplit=1)[0].strip().lower()
    if media_type != "application/x-www-form-urlencoded":
        return refusal(400, "invalid_request", "Send application/x-www-form-urlencoded.")
    form: dict[str, str] = {}
    for name, value in items:
        if name in form:
            return refusal(400, "invalid_request", f"Parameter '{name}' is repeated.")
        form[name] = value
    parts = authorization.split(None, 1)
    if not parts or parts[0].lower() != "basic":
        return TokenRequest(form, form.get("client_id"), "")
    if "client_secret" in form:
        return refusal(
            400, "invalid_request", "Authenticate with Basic or with the form, not both."
        )
    token = parts[1].strip() if len(parts) == 2 else ""
    client_id = _basic_credentials(token)
    if client_id is None:
        return refusal(401, "invalid_client", "The Basic authorization header is malformed.")
    return TokenRequest(form, client_id, f"Basic {token}")


# The one read before the tenant is known: a SECURITY DEFINER function returning only what the
# grant needs (row-level security hides every tenant's clients until one is named).
_TOKEN_CLIENT = text(
    "SELECT tenant_id, principal_id, kind, secret_hash, allowed_scopes "
    "FROM memgate_token_client(:client_id)"
)


def presented_secret(request: TokenRequest) -> str:
    """The secret of the one authentication method `check_request` let through."""
    if request.authorization:
        return basic_secret(request.authorization.split(" ", 1)[1]) or ""
    return request.form.get("client_secret", "")


async def authenticate(
    lookup: async_sessionmaker[AsyncSession], request: TokenRequest, *, db_wait: float
) -> RegisteredClient | None:
    """The calling client if its secret matches, else None (unknown, disabled and wrong-secret
    ids cost the same argon2 work). The client is read in a session closed before the hash is
    queued for, so no pool connection is held while waiting for an argon2 slot; at most
    `LOOKUPS_AT_ONCE` such reads run at once, and one waits at most `db_wait` seconds
    (TimeoutError)."""
    async with asyncio.timeout(db_wait), LOOKUPS_AT_ONCE, lookup() as short:
        client = await load_client(short, request.client_id)
    secret = presented_secret(request)
    candidate = client or unknown_client(request.client_id or "")
    matches: bool = await anyio.to_thread.run_sync(
        verify_secret, candidate.secret_hash, secret, limiter=GRANTS_AT_ONCE
    )
    if not matches or client is None:
        return None
    client.verified_secret = secret
    return client


async def load_client(session: AsyncSession, client_id: str | None) -> RegisteredClient | None:
    try:
        parsed = uuid.UUID(client_id or "")
    except ValueError:
        return None
    row = (await session.execute(_TOKEN_CLIENT, {"client_id": parsed})).one_or_none()
    if row is None:
        return None
    return RegisteredClient(
        client_id=str(parsed),
        tenant_id=row.tenant_id,
        principal_id=row.principal_id,
        kind=row.kind,
        secret_hash=row.secret_hash,
        allowed_scopes=frozenset(row.allowed_scopes),
    )


def _token_generator(config: IssuerConfig, key: SigningJwk) -> Any:
    def generate(
        grant_type: str,
        client: RegisteredClient,
        user: Any = None,
        scope: str | None = None,
        expires_in: int | None = None,
        include_refresh_token: bool = False,
    ) -> dict[str, Any]:
        granted = client.get_allowed_scope(scope or "")
        if not granted:
            raise InvalidScopeError("none of the requested scopes may be granted to this client")
        now = int(time.time())
        claims = {
            "iss": config.issuer,
            "aud": config.audience,
            "sub": str(client.principal_id),
            "tenant": str(client.tenant_id),
            "client_id": client.client_id,
            "scope": granted,
            "jti": uuid.uuid4().hex,
            "iat": now,
            "nbf": now,
            "exp": now + config.ttl_seconds,
        }
        header = {"alg": key.alg, "typ": "at+jwt", "kid": key.kid}
        return {
            "access_token": jwt.encode(header, claims, key, algorithms=[str(key.alg)]),
            "token_type": "Bearer",
            "expires_in": config.ttl_seconds,
            "scope": granted,
            "issued_token_type": "urn:ietf:params:oauth:token-type:access_token",
        }

    return generate


def _no_token(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """The generator of a grant whose client did not authenticate: authlib refuses it first."""
    raise RuntimeError("a token was generated for a client that did not authenticate")


@dataclass(frozen=True)
class TokenOutcome:
    answer: OAuthAnswer
    failed_authentication: bool
    """A client secret was checked and did not match (what the failure limiter counts)."""


async def token_response(
    session: AsyncSession,
    lookup: async_sessionmaker[AsyncSession],
    config: IssuerConfig,
    kek: KeyEncryptionKey,
    *,
    db_wait: float,
    content_type: str,
    items: list[tuple[str, str]],
    authorization: str,
) -> TokenOutcome:
    """Run the token endpoint. Errors use RFC 6749 §5.2 codes."""
    checked = check_request(content_type, items, authorization)
    if not isinstance(checked, TokenRequest):
        return TokenOutcome(checked, failed_authentication=False)
    client = await authenticate(lookup, checked, db_wait=db_wait)
    server = _Server(client)
    if client is None:
        server.register_token_generator("default", _no_token)
    else:
        async with asyncio.timeout(db_wait):
            key = await active_signing_key(session, kek)
        server.register_token_generator("default", _token_generator(config, key))
    # authlib reads 'Authorization' case-sensitively; it gets nothing else of the request.
    request = _FormRequest(
        config.issuer + "/oauth/token", checked.form, {"Authorization": checked.authorization}
    )
    # No hashing left in the grant (the secret was verified above): it runs on the loop.
    answer: OAuthAnswer = server.create_token_response(request)
    return TokenOutcome(answer, failed_authentication=client is None)


def presented_client_id(items: list[tuple[str, str]], authorization: str) -> str | None:
    """The client id a token request names (form or Basic), unverified: for its audit row."""
    parts = authorization.split(None, 1)
    if len(parts) == 2 and parts[0].lower() == "basic":
        return _basic_credentials(parts[1].strip())
    return next((value for name, value in items if name == "client_id"), None)


def issued_claims(access_token: str) -> dict[str, Any]:
    """The claims of a token this issuer has just signed (no verification needed)."""
    payload = access_token.split(".")[1]
    claims: dict[str, Any] = json.loads(
        base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
    )
    return claims
