"""Finding the issuer a tenant registered for a token, before any tenant is known.

The lookup goes through `memgate_tenant_issuer(iss, aud)` (migration `20261201_tenant_issuers`),
the one narrow read row-level security lets through without a tenant: at most the one row of
that exact pair, only its verification config. Its tenant becomes the token's tenant.

A found config is kept for `cache_seconds` (a few seconds) per worker, so a busy issuer costs no
extra round trip per request; a pair that is not registered is never cached, so a new issuer
works from the next request. A deleted issuer stops at once anyway: the entrance statement
checks its row (service/auth/resolver.py). Each issuer's keys are cached on their own
(`CachedKeySet`, single flight, fail fast), so an issuer whose JWKS hangs delays only its own
tokens, by at most one fetch timeout per `min_refetch`.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import OrderedDict
from typing import Any, TypeVar

from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.auth.tokens import CachedKeySet, TokenRejected, TrustedIssuer, storable
from service.issuers.jwks import guarded_jwks_fetcher

_LOOKUP = text(
    "SELECT tenant_id, id, jwks_url, algorithms, require_typ, subject_claim, scope_claim, "
    "client_id_claim FROM memgate_tenant_issuer(:issuer, :audience)"
)
LOOKUPS_AT_ONCE = 4
"""Connections cache misses may hold at once: tokens naming unknown issuers (junk included)
queue here instead of taking the call pool."""
LOOKUP_WAIT_SECONDS = 2.0
MAX_CACHED = 2048
KEYS_TTL_SECONDS = 300.0
"""How long a tenant issuer's JWKS is trusted before it is fetched again (an unknown `kid`
refetches sooner, at most once per `min_refetch`)."""
MAX_CLAIM_CHARS = 500
K = TypeVar("K")
V = TypeVar("V")


class TenantIssuerDirectory:
    def __init__(
        self,
        sessionmaker: async_sessionmaker[AsyncSession],
        *,
        cache_seconds: float,
        jwks_timeout: float,
        allow_loopback: bool,
        min_refetch: float,
    ) -> None:
        self._sessionmaker = sessionmaker
        self._cache_seconds = cache_seconds
        self._jwks_timeout = jwks_timeout
        self._allow_loopback = allow_loopback
        self._min_refetch = min_refetch
        self._found: OrderedDict[tuple[str, str], tuple[float, TrustedIssuer]] = OrderedDict()
        self._keys: OrderedDict[tuple[uuid.UUID, str], CachedKeySet] = OrderedDict()
        self._lookups = asyncio.Semaphore(LOOKUPS_AT_ONCE)
        self.lookup_count = 0

    async def find(self, issuer: str, audience: str) -> TrustedIssuer | None:
        if len(issuer) > MAX_CLAIM_CHARS or len(audience) > MAX_CLAIM_CHARS:
            return None  # longer than anything registration accepts
        if not (storable(issuer) and storable(audience)):
            return None  # nothing registered holds a NUL or a lone surrogate
        key = (issuer, audience)
        cached = self._found.get(key)
        if cached is not None and time.monotonic() < cached[0]:
            return cached[1]
        row = await self._lookup(issuer, audience)
        if row is None:
            self._found.pop(key, None)
            return None
        trusted = self._trusted(issuer, audience, row)
        if self._cache_seconds > 0:
            _remember(self._found, key, (time.monotonic() + self._cache_seconds, trusted))
        return trusted

    async def _lookup(self, issuer: str, audience: str) -> Any:
        try:
            async with asyncio.timeout(LOOKUP_WAIT_SECONDS), self._lookups:
                self.lookup_count += 1
                async with self._sessionmaker() as session:
                    result = await session.execute(
                        _LOOKUP, {"issuer": issuer, "audience": audience}
                    )
                    return result.one_or_none()
        except (TimeoutError, SQLAlchemyError):
            raise TokenRejected("the issuer could not be looked up; try again") from None

    def _trusted(self, issuer: str, audience: str, row: Any) -> TrustedIssuer:
        return TrustedIssuer(
            issuer=issuer,
            audience=audience,
            algorithms=tuple(row.algorithms),
            keys=self._key_set(row.id, row.jwks_url),
            require_typ=row.require_typ,
            require_jti=False,
            subject_claim=row.subject_claim,
            scope_claim=row.scope_claim,
            client_id_claim=row.client_id_claim,
            tenant_id=row.tenant_id,
            issuer_id=row.id,
        )

    def _key_set(self, issuer_id: uuid.UUID, jwks_url: str) -> CachedKeySet:
        """One key cache per registration and URL, kept across config refreshes (a fresh
        config must not mean a fresh JWKS fetch every few seconds)."""
        key = (issuer_id, jwks_url)
        found = self._keys.get(key)
        if found is None:
            fetch = guarded_jwks_fetcher(
                jwks_url, timeout=self._jwks_timeout, allow_loopback=self._allow_loopback
            )
            found = CachedKeySet(
                fetch, ttl=KEYS_TTL_SECONDS, min_refetch=self._min_refetch, fail_fast=True
            )
        _remember(self._keys, key, found)
        return found


def _remember(cache: OrderedDict[K, V], key: K, value: V) -> None:
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > MAX_CACHED:
        cache.popitem(last=False)
