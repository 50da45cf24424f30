"""Enforcing the limits across replicas, with the state in PostgreSQL.

- **Limits** are read per tenant (every row of the tenant in one statement) and kept for
  `MEMGATE_QUOTA_CONFIG_SECONDS`: a tenant without limits costs one small read per that
  period on each replica, never one per request.
- **Rates** (requests, token requests, embedding calls) are token buckets whose state is one
  `quota_buckets` row. A replica leases a small batch (about `MEMGATE_QUOTA_LEASE_SECONDS` of
  the rate, at least 1, at most `MEMGATE_QUOTA_LEASE_MAX`) in one atomic statement and spends
  it locally; what it has not spent after the lease period is dropped. The shared row never
  hands out more than the bucket holds, so the only overshoot is a lease spent later than it
  was taken: at most rate x lease period requests more in any window, however many replicas
  there are. What a replica drops unspent is the undershoot, at most a batch per replica.
  Once the row says the bucket is empty the replica refuses locally until the next token is
  due (nobody can add tokens earlier), so a flood of refused requests costs no database work.
- **Concurrency** is slots held per replica in `quota_slots`, each row with an expiry that
  every claim and release renews: a killed replica's slots lapse after
  `MEMGATE_QUOTA_SLOT_SECONDS`. A claim locks the tenant's (or client's) limits row, so two
  replicas cannot both take the last slot. It costs a short transaction at the start and the
  end of each request, on this module's own two connections.

Each statement runs on a small engine of its own (never the calls' pool, which the waiting
call already holds a connection of) and commits at once, so a call rolled back later still
spent its token, and no bucket row stays locked while a call runs.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from dataclasses import dataclass, field

import structlog
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from service.auth.principal import Principal
from service.db.session import create_sessionmaker
from service.db.tenancy import name_tenant
from service.problems import InvalidRequest
from service.quotas.problems import Bitten, RateLimited, quota_exceeded, rate_limited
from service.quotas.schemas import Limits, burst_of
from service.quotas.service import TENANT_SCOPE, all_limits_of, counted_usage
from service.settings import QuotaSettings

_log = structlog.get_logger("memgate.quotas")

QUOTA_CONNECTIONS = 1
"""The limiter's own connection per replica, no overflow: leases and slot claims are short
transactions, and one more connection per worker keeps four workers within the embedded
cluster's 100 connections (service/http/workers.py)."""
MAX_TRACKED = 10_000
"""Tenants (and buckets, and slot keys) kept per replica; past it the cache starts over."""

# The refill is computed once per lease in the sub-select, from the row's old values.
_LEASE = text(
    """
INSERT INTO quota_buckets AS b (tenant_id, client_id, kind, tokens, last_grant, updated_at)
VALUES (:t, :c, :k, :burst - least(:want, :burst), least(:want, :burst), statement_timestamp())
ON CONFLICT (tenant_id, client_id, kind) DO UPDATE SET
    (last_grant, tokens, updated_at) = (
        SELECT least(:want, floor(r.tokens)), r.tokens - least(:want, floor(r.tokens)),
               statement_timestamp()
          FROM (SELECT least(CAST(:burst AS double precision),
                             b.tokens + CAST(:rate AS double precision)
                             * extract(epoch FROM statement_timestamp() - b.updated_at)
                               ::double precision) AS tokens) r)
RETURNING last_grant, tokens
"""
)
_LOCK_SCOPE = text("SELECT 1 FROM tenant_limits WHERE tenant_id = :t AND client_id = :c FOR UPDATE")
_CLAIM = text(
    """
INSERT INTO quota_slots (tenant_id, client_id, replica, held, expires_at)
SELECT :t, :c, :r, :held, clock_timestamp() + make_interval(secs => :ttl)
 WHERE (SELECT coalesce(sum(held), 0) FROM quota_slots
         WHERE tenant_id = :t AND client_id = :c AND replica <> :r
           AND expires_at > clock_timestamp()) + :held <= :limit
ON CONFLICT (tenant_id, client_id, replica) DO UPDATE
   SET held = EXCLUDED.held, expires_at = EXCLUDED.expires_at
RETURNING held
"""
)
_RELEASE = text(
    "UPDATE quota_slots SET held = :held, expires_at = clock_timestamp() + make_interval(secs "
    "=> :ttl) WHERE tenant_id = :t AND client_id = :c AND replica = :r"
)


@dataclass(frozen=True)
class TenantLimits:
    tenant: Limits
    clients: dict[str, Limits]

    @property
    def none(self) -> bool:
        return self.tenant.empty and all(limits.empty for limits in self.clients.values())

    def of_client(self, principal: Principal) -> Limits | None:
        """A client's own limits: only our own clients have them (an external IdP's client ids
        are its own, so its tokens count against the tenant's limits only)."""
        return self.clients.get(principal.client_id) if principal.embedded else None


@dataclass
class _Cached:
    limits: TenantLimits
    until: float


@dataclass
class _Lease:
    held: int = 0
    expires: float = 0.0
    empty_until: float = 0.0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def spend(self, now: float) -> bool:
        if self.held > 0 and self.expires > now:
            self.held -= 1
            return True
        return False


@dataclass
class _Slots:
    in_flight: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


@dataclass(frozen=True)
class _Rate:
    kind: str
    policy: str
    rate: float
    burst: int
    unit: str

    def bitten(self, retry_after: float) -> Bitten:
        window = max(1, round(self.burst / self.rate))
        words = f"{self.rate:g} {self.unit} per second (burst {self.burst})"
        return Bitten(self.policy, self.burst, window, retry_after, words)


def _requests(limits: Limits | None, who: str) -> _Rate | None:
    if limits is None or limits.requests_per_second is None:
        return None
    rate = limits.requests_per_second
    burst = burst_of(rate, limits.request_burst)
    return _Rate("requests", f"{who}-requests", rate, burst, "requests")


def _tokens(limits: Limits | None, who: str) -> _Rate | None:
    if limits is None or limits.token_requests_per_second is None:
        return None
    rate = limits.token_requests_per_second
    burst = burst_of(rate, limits.token_burst)
    return _Rate("tokens", f"{who}-token-requests", rate, burst, "token requests")


@dataclass
class Admission:
    """A call let in; `release` gives its concurrency slots back (once)."""

    quotas: Quotas
    tenant_id: uuid.UUID
    slots: list[tuple[str, int]] = field(default_factory=list)

    async def release(self) -> None:
        slots, self.slots = self.slots, []
        for scope, _ in slots:
            await self.quotas.release_slot(self.tenant_id, scope)


class Quotas:
    """One replica's view of every tenant's limits and its share of their shared state."""

    def __init__(self, engine: AsyncEngine, settings: QuotaSettings) -> None:
        self._engine = engine
        self._sessions = create_sessionmaker(engine)
        self.settings = settings
        self.replica = uuid.uuid4()
        """This replica's name on its slots (one per runtime: every worker is a replica)."""
        self._config: dict[uuid.UUID, _Cached] = {}
        self._config_locks: dict[uuid.UUID, asyncio.Lock] = {}
        self._leases: dict[tuple[uuid.UUID, str, str], _Lease] = {}
        self._slots: dict[tuple[uuid.UUID, str], _Slots] = {}

    async def close(self) -> None:
        await self._engine.dispose()

    def forget(self, tenant_id: uuid.UUID | None = None) -> None:
        """Read the limits again on next use (all tenants when None): for a change made in this
        process; other replicas see it within `config_seconds`."""
        if tenant_id is None:
            self._config.clear()
        else:
            self._config.pop(tenant_id, None)

    async def limits(self, tenant_id: uuid.UUID) -> TenantLimits:
        cached = self._config.get(tenant_id)
        if cached is not None and cached.until > time.monotonic():
            return cached.limits
        lock = self._config_locks.setdefault(tenant_id, asyncio.Lock())
        async with lock:  # one read per tenant, however many calls arrive at once
            cached = self._config.get(tenant_id)
            if cached is not None and cached.until > time.monotonic():
                return cached.limits
            async with self._sessions.begin() as session:
                await name_tenant(session, tenant_id)
                rows = await all_limits_of(session, tenant_id)
            limits = TenantLimits(rows.get(TENANT_SCOPE, Limits()), rows)
            if len(self._config) >= MAX_TRACKED:
                self._config.clear()
                self._config_locks = {tenant_id: lock}
            until = time.monotonic() + self.settings.config_seconds
            self._config[tenant_id] = _Cached(limits, until)
            return limits

    # -- the entrance -------------------------------------------------------------------------

    async def admit(self, principal: Principal) -> Admission | None:
        """Let an authenticated call in, or raise `RateLimited` (nothing spent is kept: a token
        taken from one bucket before another refused is given back locally, and a slot claimed
        before a later refusal or failure is released)."""
        limits = await self.limits(principal.tenant_id)
        if limits.none:
            return None
        client = limits.of_client(principal)
        tenant_id = principal.tenant_id
        rates = [
            (principal.client_id, _requests(client, "client")),
            (TENANT_SCOPE, _requests(limits.tenant, "tenant")),
        ]
        admission = Admission(self, tenant_id)
        spent: list[tuple[str, str]] = []
        try:
            for scope, rate in rates:
                if rate is not None:
                    await self._take(tenant_id, scope, rate)
                    spent.append((scope, rate.kind))
            for scope, concurrent, who in (
                (principal.client_id, client.concurrent_requests if client else None, "client"),
                (TENANT_SCOPE, limits.tenant.concurrent_requests, "tenant"),
            ):
                if concurrent is not None:
                    await self._claim(tenant_id, scope, concurrent, who)
                    admission.slots.append((scope, concurrent))
        except BaseException:  # refused, or the limiter's database failed: nothing is kept
            for scope, kind in spent:
                self._refund(tenant_id, scope, kind)
            await admission.release()
            raise
        return admission

    async def admit_token(self, tenant_id: uuid.UUID, client_id: str) -> None:
        """A token about to be issued to `client_id` (one of our clients) of `tenant_id`."""
        limits = await self.limits(tenant_id)
        if limits.none:
            return
        client = _tokens(limits.clients.get(client_id), "client")
        tenant = _tokens(limits.tenant, "tenant")
        if client is not None:
            await self._take(tenant_id, client_id, client)
        if tenant is not None:
            try:
                await self._take(tenant_id, TENANT_SCOPE, tenant)
            except RateLimited:
                if client is not None:
                    self._refund(tenant_id, client_id, client.kind)
                raise

    async def admit_embedding(self, tenant_id: uuid.UUID) -> None:
        """One call of the embedder for the tenant (a write or a search)."""
        per_minute = (await self.limits(tenant_id)).tenant.embedding_calls_per_minute
        if per_minute is not None:
            rate = _Rate(
                "embeddings", "tenant-embeddings", per_minute / 60, per_minute, "embedding calls"
            )
            await self._take(tenant_id, TENANT_SCOPE, rate, per_minute_words=per_minute)

    async def admit_embeddings(self, tenant_id: uuid.UUID, count: int) -> None:
        """`count` embedding calls at once (a batch write: one per item), or none: a refusal
        gives back what the batch took before it. More than the bucket ever holds (its
        burst, a minute's calls) is 422 naming the largest batch the quota admits: a 429
        would tell the client to retry a batch that can never pass."""
        per_minute = (await self.limits(tenant_id)).tenant.embedding_calls_per_minute
        if per_minute is None:
            return
        if count > per_minute:
            raise InvalidRequest(
                f"The batch has {count} items, and the tenant's embedding quota admits at most "
                f"{per_minute} embedding calls at once ({per_minute} a minute; one per item). "
                f"Nothing was written: send at most {per_minute} items per batch.",
                errors=[
                    {
                        "field": "items",
                        "source": "body",
                        "message": f"Expected at most {per_minute} items (the embedding quota)",
                    }
                ],
                max_items=per_minute,
            )
        rate = _Rate(
            "embeddings", "tenant-embeddings", per_minute / 60, per_minute, "embedding calls"
        )
        taken = 0
        try:
            for _ in range(count):
                await self._take(tenant_id, TENANT_SCOPE, rate, per_minute_words=per_minute)
                taken += 1
        except BaseException:
            for _ in range(taken):
                self._refund(tenant_id, TENANT_SCOPE, rate.kind)
            raise

    async def check_storage(self, session: AsyncSession, tenant_id: uuid.UUID) -> None:
        """After a write, in its transaction: refuse it (raise; the call rolls back) if the
        tenant now stores more memories (every version) or bytes than its quota."""
        tenant = (await self.limits(tenant_id)).tenant
        if tenant.max_memories is None and tenant.max_bytes is None:
            return
        memories, size = await counted_usage(session, tenant_id)
        for policy, quota, used, unit in (
            ("tenant-memories", tenant.max_memories, memories, "memories"),
            ("tenant-bytes", tenant.max_bytes, size, "bytes of stored memories"),
        ):
            if quota is not None and used > quota:
                bitten = Bitten(policy, quota, None, 60.0, f"{quota} {unit}")
                raise quota_exceeded(bitten, used)

    # -- token buckets ------------------------------------------------------------------------

    def _lease_of(self, key: tuple[uuid.UUID, str, str]) -> _Lease:
        lease = self._leases.get(key)
        if lease is None:
            if len(self._leases) >= MAX_TRACKED:
                self._leases.clear()
            lease = self._leases[key] = _Lease()
        return lease

    def _refund(self, tenant_id: uuid.UUID, scope: str, kind: str) -> None:
        lease = self._leases.get((tenant_id, scope, kind))
        if lease is not None and lease.expires > time.monotonic():
            lease.held += 1

    def _batch(self, rate: _Rate) -> int:
        wanted = math.floor(rate.rate * self.settings.lease_seconds)
        return max(1, min(wanted, self.settings.lease_max, rate.burst))

    async def _take(
        self, tenant_id: uuid.UUID, scope: str, rate: _Rate, per_minute_words: int | None = None
    ) -> None:
        lease = self._lease_of((tenant_id, scope, rate.kind))
        if lease.spend(time.monotonic()):
            return
        async with lease.lock:
            now = time.monotonic()
            if lease.spend(now):  # another call leased while this one waited
                return
            if lease.empty_until > now:
                raise self._refusal(rate, lease.empty_until - now, per_minute_words)
            granted, left = await self._lease(tenant_id, scope, rate)
            now = time.monotonic()
            if granted == 0:
                wait = (1.0 - left) / rate.rate
                lease.held, lease.empty_until = 0, now + wait
                raise self._refusal(rate, wait, per_minute_words)
            lease.held, lease.expires = granted - 1, now + self.settings.lease_seconds

    @staticmethod
    def _refusal(rate: _Rate, wait: float, per_minute: int | None) -> RateLimited:
        bitten = rate.bitten(wait)
        if per_minute is not None:  # said the way it was configured
            words = f"{per_minute} {rate.unit} per minute"
            bitten = Bitten(rate.policy, per_minute, 60, wait, words)
        return rate_limited(bitten)

    async def _lease(self, tenant_id: uuid.UUID, scope: str, rate: _Rate) -> tuple[int, float]:
        params = {
            "t": tenant_id,
            "c": scope,
            "k": rate.kind,
            "want": self._batch(rate),
            "burst": rate.burst,
            "rate": rate.rate,
        }
        async with self._sessions.begin() as session:
            await name_tenant(session, tenant_id)
            row = (await session.execute(_LEASE, params)).one()
        return int(row.last_grant), float(row.tokens)

    # -- concurrency --------------------------------------------------------------------------

    def _slots_of(self, key: tuple[uuid.UUID, str]) -> _Slots:
        slots = self._slots.get(key)
        if slots is None:
            slots = self._slots[key] = _Slots()
        return slots

    async def _claim(self, tenant_id: uuid.UUID, scope: str, limit: int, who: str) -> None:
        slots = self._slots_of((tenant_id, scope))
        async with slots.lock:
            held = slots.in_flight + 1
            params = {
                "t": tenant_id,
                "c": scope,
                "r": self.replica,
                "held": held,
                "limit": limit,
                "ttl": self.settings.slot_seconds,
            }
            async with self._sessions.begin() as session:
                await name_tenant(session, tenant_id)
                await session.execute(_LOCK_SCOPE, params)
                claimed = (await session.execute(_CLAIM, params)).scalar_one_or_none()
            if claimed is None:
                words = f"{limit} requests at once"
                raise rate_limited(Bitten(f"{who}-concurrency", limit, None, 1.0, words))
            slots.in_flight = held

    async def release_slot(self, tenant_id: uuid.UUID, scope: str) -> None:
        slots = self._slots_of((tenant_id, scope))
        async with slots.lock:
            slots.in_flight = max(0, slots.in_flight - 1)
            params = {
                "t": tenant_id,
                "c": scope,
                "r": self.replica,
                "held": slots.in_flight,
                "ttl": self.settings.slot_seconds,
            }
            try:
                async with self._sessions.begin() as session:
                    await name_tenant(session, tenant_id)
                    await session.execute(_RELEASE, params)
            except Exception as exc:  # the slot lapses at its expiry instead
                _log.warning("quota_slot_release_failed", error_type=type(exc).__name__)
