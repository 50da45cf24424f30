"""Access-token verification with joserfc, per trusted issuer.

Order matters: the issuer is chosen from the (unverified) `iss` *before* any key lookup, the key
comes only from that issuer's own key source (never from `jku`, `x5u` or `jwk` headers), the
algorithm must be on that issuer's allow-list, and only then are signature and claims checked.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, cast

import httpx
from joserfc import jws, jwt
from joserfc.errors import JoseError
from joserfc.jwk import KeySet, KeySetSerialization
from joserfc.jwt import JWTClaimsRegistry

from service.auth.scopes import parse_scopes

MAX_TOKEN_BYTES = 8192
MAX_KID_CHARS = 128
ACCESS_TOKEN_TYPES = frozenset({"at+jwt", "application/at+jwt"})


REGISTERED_REFUSAL = "not valid for its issuer"
"""The one 401 wording once a tenant-registered (iss, aud) pair is picked: anyone may send such
a token, so the answer must not tell its registration's algorithms, key ids or JWKS health
(red-team F6). The precise reason goes to the log and the audit row."""


class TokenRejected(Exception):
    """Verification failed. The message is for the 401 body; it never echoes the token.
    `reason`: the precise, fixed-text reason when the message is deliberately vaguer."""

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason


KeyFetcher = Callable[[], Awaitable[dict[str, Any]]]


class CachedKeySet:
    """A JWKS with a TTL, refetched on an unknown `kid` at most once per `min_refetch` seconds
    behind a single-flight lock; keeps serving the last good keys if a refetch fails."""

    def __init__(
        self,
        fetch: KeyFetcher,
        *,
        ttl: float = 600.0,
        min_refetch: float = 30.0,
        fail_fast: bool = False,
    ):
        """`fail_fast`: a source that never answered is not asked again for `min_refetch`
        seconds either (its tokens are refused at once meanwhile), so a URL that hangs costs
        one timeout per `min_refetch`, not one per request (tenant-registered issuers, whose
        URL a tenant admin picks)."""
        self._fetch = fetch
        self._ttl = ttl
        self._min_refetch = min_refetch
        self._fail_fast = fail_fast
        self._keys: KeySet | None = None
        self._fetched_at = float("-inf")
        self._attempted_at = float("-inf")
        self._lock = asyncio.Lock()
        self.fetch_count = 0

    async def find(self, kid: str) -> KeySet | None:
        if self._needs_load():
            await self._refresh(self._needs_load)
        found = self._lookup(kid)
        if found is None and self._may_refetch():
            await self._refresh(lambda: self._lookup(kid) is None and self._may_refetch())
            found = self._lookup(kid)
        return found

    def invalidate(self) -> None:
        """Forget the rate limit, e.g. right after this process rotated keys itself."""
        self._attempted_at = float("-inf")
        self._fetched_at = float("-inf")

    def _needs_load(self) -> bool:
        """No keys yet; or keys past their TTL, unless the last attempt (failed or still running)
        is younger than `min_refetch`: then the last good keys keep serving, and a source that
        is down is not asked again on every lookup."""
        if self._keys is None:
            return not self._fail_fast or self._may_refetch()
        if time.monotonic() - self._fetched_at <= self._ttl:
            return False
        return self._fetched_at >= self._attempted_at or self._may_refetch()

    def _may_refetch(self) -> bool:
        return time.monotonic() - self._attempted_at >= self._min_refetch

    def _lookup(self, kid: str) -> KeySet | None:
        if self._keys is None:
            return None
        matches = [key for key in self._keys.keys if key.kid == kid]
        return KeySet(matches) if len(matches) == 1 else None

    async def _refresh(self, still_needed: Callable[[], bool]) -> None:
        async with self._lock:
            if not still_needed():
                return  # another task refreshed while we waited (single flight)
            self._attempted_at = time.monotonic()
            self.fetch_count += 1
            try:
                document = await self._fetch()
                self._keys = KeySet.import_key_set(cast(KeySetSerialization, document))
                self._fetched_at = time.monotonic()
            except (httpx.HTTPError, ValueError, KeyError, JoseError):
                if self._keys is None:
                    raise TokenRejected("issuer keys are unavailable") from None


def http_jwks_fetcher(url: str, *, timeout: float = 5.0, max_bytes: int = 256_000) -> KeyFetcher:
    async def fetch() -> dict[str, Any]:
        async with httpx.AsyncClient(timeout=timeout, follow_redirects=False) as client:
            response = await client.get(url, headers={"Accept": "application/json"})
            response.raise_for_status()
            if len(response.content) > max_bytes:
                raise ValueError("JWKS document too large")
            document: dict[str, Any] = response.json()
            return document

    return fetch


@dataclass(frozen=True)
class TrustedIssuer:
    issuer: str
    audience: str
    algorithms: tuple[str, ...]
    keys: CachedKeySet
    require_typ: bool = True
    require_jti: bool = True
    embedded: bool = False
    tenant_claim: str = "tenant"
    subject_claim: str = "sub"
    scope_claim: str = "scope"
    client_id_claim: str = "client_id"
    tenant_id: uuid.UUID | None = None
    """A tenant-registered issuer's tenant: every token it verifies belongs to it, whatever
    the token's claims say (None: the operator's issuers, whose tokens name their tenant)."""
    issuer_id: uuid.UUID | None = None
    """The `tenant_issuers` row it came from; the entrance checks it is still there."""


class IssuerDirectory(Protocol):
    """Where issuers a tenant registered are found, by a token's `iss` and its one `aud`
    (service/issuers/directory.py)."""

    async def find(self, issuer: str, audience: str) -> TrustedIssuer | None: ...


@dataclass(frozen=True)
class VerifiedToken:
    issuer: TrustedIssuer
    tenant_id: uuid.UUID
    subject: str
    client_id: str
    scopes: frozenset[str]
    token_id: str
    act: dict[str, Any] | None
    claims: dict[str, Any]


class TokenVerifier:
    def __init__(
        self,
        issuers: list[TrustedIssuer],
        *,
        leeway: int,
        max_ttl: int,
        directory: IssuerDirectory | None = None,
    ) -> None:
        """`issuers`: the embedded and the operator's issuers, chosen by `iss` alone and always
        first; `directory`: the issuers tenants registered, chosen by (`iss`, `aud`)."""
        self._issuers = {issuer.issuer: issuer for issuer in issuers}
        self._leeway = leeway
        self._max_ttl = max_ttl
        self._directory = directory

    def trusts(self, issuer: str) -> bool:
        return issuer in self._issuers

    async def verify(self, token: str) -> VerifiedToken:
        if len(token) > MAX_TOKEN_BYTES:
            raise TokenRejected("token too large")
        header, unverified = _peek(token)
        issuer = await self._issuer_of(unverified)
        if issuer.tenant_id is None:
            return await self._verified_by(issuer, header, token)
        try:
            return await self._verified_by(issuer, header, token)
        except TokenRejected as exc:
            raise TokenRejected(REGISTERED_REFUSAL, reason=str(exc)) from None

    async def _verified_by(
        self, issuer: TrustedIssuer, header: dict[str, Any], token: str
    ) -> VerifiedToken:
        alg = header.get("alg")
        if alg not in issuer.algorithms:
            raise TokenRejected("algorithm not allowed for this issuer")
        kid = header.get("kid")
        if not isinstance(kid, str) or not kid or len(kid) > MAX_KID_CHARS:
            raise TokenRejected("missing or invalid key id")
        keys = await issuer.keys.find(kid)
        if keys is None:
            raise TokenRejected("unknown key id")
        try:
            decoded = jwt.decode(token, keys, algorithms=list(issuer.algorithms))
        except (JoseError, ValueError) as exc:
            raise TokenRejected("bad signature or malformed token") from exc
        if issuer.require_typ and str(decoded.header.get("typ", "")).lower() not in (
            ACCESS_TOKEN_TYPES
        ):
            raise TokenRejected("token type is not at+jwt")
        claims = decoded.claims
        self._check_claims(issuer, claims)
        return _to_verified(issuer, claims)

    async def _issuer_of(self, unverified: dict[str, Any]) -> TrustedIssuer:
        iss = unverified.get("iss")
        # Only a string names an issuer; a list or object `iss` is unhashable and never trusted.
        # Nor one the database cannot take (a lone surrogate, a NUL): no issuer is registered
        # with it, and looking it up answered 500 (red-team F4).
        if not isinstance(iss, str) or not storable(iss):
            raise TokenRejected("untrusted issuer")
        issuer = self._issuers.get(iss)
        if issuer is None and self._directory is not None:
            audience = _single_audience(unverified.get("aud"))
            if audience is not None and storable(audience):
                issuer = await self._directory.find(iss, audience)
        if issuer is None:
            raise TokenRejected("untrusted issuer")
        return issuer

    def _check_claims(self, issuer: TrustedIssuer, claims: dict[str, Any]) -> None:
        required: dict[str, Any] = {
            "iss": {"essential": True, "value": issuer.issuer},
            "aud": {"essential": True},
            "exp": {"essential": True},
            "iat": {"essential": True},
            issuer.subject_claim: {"essential": True},
        }
        if issuer.require_jti:
            required["jti"] = {"essential": True}
        try:
            JWTClaimsRegistry(leeway=self._leeway, **required).validate(claims)
        except JoseError as exc:
            raise TokenRejected(f"claim check failed: {exc.error}") from exc
        if not _exactly_our_audience(claims["aud"], issuer.audience):
            raise TokenRejected("the audience is not exactly this service")
        if claims["exp"] - claims["iat"] > self._max_ttl:
            raise TokenRejected("token lifetime exceeds the maximum")


def _exactly_our_audience(aud: object, expected: str) -> bool:
    """`aud` is the audience as a string, or a list holding only it (RFC 7519 allows both
    forms). joserfc accepts any list that contains it, but a token also meant for another API
    could be replayed here by that API, so a second audience refuses the token."""
    return aud in (expected, [expected])


def storable(text: str) -> bool:
    """Whether `text` can be a query parameter: UTF-8 encodable (no lone surrogate) and no NUL,
    which PostgreSQL text refuses. Token claims are JSON, where both are legal escapes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in text


def _single_audience(aud: object) -> str | None:
    """The one audience an unverified token names (a string or a one-element list), else None:
    a token naming two audiences is never accepted anyway."""
    if isinstance(aud, list) and len(aud) == 1:
        aud = aud[0]
    return aud if isinstance(aud, str) else None


def _peek(token: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Header and claims before verification, only to pick the issuer and key."""
    try:
        compact = jws.extract_compact(token.encode("ascii"))
        payload = json.loads(compact.payload)
    except (JoseError, ValueError, UnicodeError) as exc:
        raise TokenRejected("malformed token") from exc
    if not isinstance(payload, dict):
        raise TokenRejected("malformed token")
    return dict(compact.headers()), payload


def _tenant_of(issuer: TrustedIssuer, claims: dict[str, Any]) -> uuid.UUID:
    """The operator's issuers name the tenant in a claim; a tenant-registered issuer's tokens
    belong to its tenant, and one whose tenant claim names anything else is refused (an IdP
    that a tenant admin configured never speaks for another tenant)."""
    claimed, fixed = claims.get(issuer.tenant_claim), issuer.tenant_id
    if fixed is not None and claimed is None:
        return fixed
    try:
        tenant_id = uuid.UUID(str(claimed))
    except ValueError:
        raise TokenRejected("token carries no valid tenant") from None
    if fixed is not None and tenant_id != fixed:
        raise TokenRejected("the token names another tenant than its issuer's")
    return tenant_id


def _to_verified(issuer: TrustedIssuer, claims: dict[str, Any]) -> VerifiedToken:
    tenant_id = _tenant_of(issuer, claims)
    subject = claims.get(issuer.subject_claim)
    if not isinstance(subject, str) or not subject or not storable(subject):
        raise TokenRejected("token carries no subject")
    client_id = str(claims.get(issuer.client_id_claim) or claims.get("azp") or "")
    if not storable(client_id):
        raise TokenRejected("token carries no usable client id")
    act = claims.get("act")
    return VerifiedToken(
        issuer=issuer,
        tenant_id=tenant_id,
        subject=subject,
        client_id=client_id,
        scopes=parse_scopes(claims.get(issuer.scope_claim, claims.get("scp"))),
        token_id=str(claims.get("jti") or claims.get("uti") or ""),
        act=act if isinstance(act, dict) else None,
        claims=claims,
    )


def presented_issuer(token: str) -> str | None:
    """The unverified `iss` of a token, for the audit row of a call whose token was refused."""
    if len(token) > MAX_TOKEN_BYTES:
        return None
    try:
        _, claims = _peek(token)
    except TokenRejected:
        return None
    iss = claims.get("iss")
    return iss if isinstance(iss, str) else None
