"""Admission to the token endpoint, per process: a bound on token requests in flight (with a
share of it per source and per client id) and token buckets on failed client
authentications, per client id and per source address.

Every token request costs an argon2id verification (two run at once) and a short database
read. Without a bound, unauthenticated callers queued for the hash without limit, and while
they did they held pool connections other tenants needed (review item 1). Here a request is
turned away before it costs anything: 429 when its client id or its source has *failed* too
often lately, 503 when too many token requests are already in flight — in the process, from
its source, or for its client id.

Only failures spend the failure allowance, when they settle. Spending it up front (the first
version) capped concurrency at the burst, so concurrent requests with the right secret were
told "too many failures" and locked other clients of their source out (red-team finding 4).
What stops a burst of concurrent wrong secrets from all passing before the first failure
counts is the per-key share of the in-flight bound instead: at most that many attempts of one
source or client id are unsettled at once, and each failure is counted when it settles, even
past the allowance (the debt delays the next admission), so over time a key fails at most
burst + rate * time + its share. The shares also keep one source or one client id from taking
the whole in-flight bound (red-team finding 5).

State lives in this process only (one replica); quotas across replicas are a later issue.
"""

from __future__ import annotations

import ipaddress
import math
import time
import uuid
from collections import Counter
from dataclasses import dataclass

from service.auth.problems import OAuthOverloaded, OAuthTooManyFailures

MAX_TRACKED_KEYS = 10_000
"""Buckets kept per process; past it, refilled buckets go first, then the oldest."""


@dataclass
class _Bucket:
    tokens: float
    updated: float


@dataclass(frozen=True)
class Admission:
    """An admitted token request; `settle` must be called exactly once when it is answered."""

    gate: TokenGate
    keys: tuple[str, ...]

    def settle(self, *, failed: bool) -> None:
        """`failed`: the client authentication was refused (not a database error, nor any other
        answer): only that spends the failure allowance."""
        self.gate.settle(self, failed=failed)


class FailureBuckets:
    """Token buckets keyed by string: `burst` failures at once, refilled at `per_minute`."""

    def __init__(self, burst: int, per_minute: float) -> None:
        self._burst = float(burst)
        self._rate = per_minute / 60.0
        self._buckets: dict[str, _Bucket] = {}

    def _refilled(self, key: str, now: float) -> _Bucket:
        bucket = self._buckets.get(key)
        if bucket is None:
            self._make_room(now)
            bucket = self._buckets[key] = _Bucket(self._burst, now)
        else:
            bucket.tokens = min(self._burst, bucket.tokens + (now - bucket.updated) * self._rate)
            bucket.updated = now
        return bucket

    def _make_room(self, now: float) -> None:
        if len(self._buckets) < MAX_TRACKED_KEYS:
            return
        for key in [
            key
            for key, bucket in self._buckets.items()
            if bucket.tokens + (now - bucket.updated) * self._rate >= self._burst
        ]:
            del self._buckets[key]
        while len(self._buckets) >= MAX_TRACKED_KEYS:
            del self._buckets[next(iter(self._buckets))]

    def wait_seconds(self, keys: tuple[str, ...], now: float) -> float:
        """0 if every key has a token to spend, else how long until all of them do."""
        waits = [
            (1.0 - bucket.tokens) / self._rate if self._rate > 0 else math.inf
            for bucket in (self._refilled(key, now) for key in keys)
            if bucket.tokens < 1.0
        ]
        return max(waits, default=0.0)

    def spend(self, keys: tuple[str, ...], now: float) -> None:
        """One failure per key. It may go below zero: attempts admitted while the allowance
        lasted still count when they fail, and the debt is paid off before the next one."""
        for key in keys:
            self._refilled(key, now).tokens -= 1.0


def _client_key(client_id: str | None) -> str:
    """Client ids are UUIDs; anything else shares one bucket (no client can be named so)."""
    try:
        return "client:" + str(uuid.UUID(client_id or ""))
    except ValueError:
        return "client:?"


def source_key(source: str) -> str:
    """An IPv4 address as it is, an IPv6 address by its /64 (one host or customer usually holds
    a whole /64, so per-address keys would give it 2**64 shares); anything else as it is."""
    try:
        address = ipaddress.ip_address(source)
    except ValueError:
        return "source:" + source
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return "source:" + str(address.ipv4_mapped)
        return "source:" + str(ipaddress.IPv6Network((address, 64), strict=False))
    return "source:" + str(address)


class TokenGate:
    def __init__(
        self,
        *,
        max_in_flight: int,
        max_in_flight_per_source: int,
        max_in_flight_per_client: int,
        failure_burst: int,
        failures_per_minute: float,
    ):
        self._max_in_flight = max_in_flight
        # A share larger than the whole bound would mean no share at all.
        self._source_share = min(max_in_flight_per_source, max_in_flight)
        self._client_share = min(max_in_flight_per_client, max_in_flight)
        self._failures = FailureBuckets(failure_burst, failures_per_minute)
        self._pending: Counter[str] = Counter()
        """Unsettled attempts per key; a key leaves when its count is back to 0, so this holds
        at most 2 * `max_in_flight` keys."""
        self.in_flight = 0

    def admit(self, client_id: str | None, source: str) -> Admission:
        """Admit a token request or raise the problem to answer instead (nothing spent)."""
        now = time.monotonic()
        client, origin = _client_key(client_id), source_key(source)
        keys = (client, origin)
        wait = self._failures.wait_seconds(keys, now)
        if wait > 0:
            retry_after = max(1, math.ceil(min(wait, 86_400.0)))
            raise OAuthTooManyFailures(
                "Too many failed client authentications from this source or for this client "
                f"id. Check the client id and secret, then retry after {retry_after} s.",
                retry_after=retry_after,
            )
        if (
            self.in_flight >= self._max_in_flight
            or self._pending[origin] >= self._source_share
            or self._pending[client] >= self._client_share
        ):
            # Busy, not failing: nothing is counted against the caller's allowance.
            raise OAuthOverloaded(
                "The token endpoint is busy with other requests (from this source, for this "
                "client id, or in all). Retry after 1 s; a token you already hold keeps working "
                "until it expires.",
                retry_after=1,
            )
        self.in_flight += 1
        self._pending.update(keys)
        return Admission(self, keys)

    def settle(self, admission: Admission, *, failed: bool) -> None:
        self.in_flight -= 1
        self._pending.subtract(admission.keys)
        for key in admission.keys:
            if self._pending[key] <= 0:
                del self._pending[key]
        if failed:
            self._failures.spend(admission.keys, time.monotonic())
