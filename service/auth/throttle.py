"""Admission to the token endpoint, per process: a bound on token requests in flight and
token buckets on failed client authentications, per client id and per source address.

Every token request costs an argon2id verification (two run at once) and a short database
read. Without a bound, unauthenticated callers queued for the hash without limit, and while
they did they held pool connections other tenants needed (review item 1). Here a request is
turned away before it costs anything: 429 when its client id or its source has failed too
often lately, 503 when too many token requests are already in flight. Each admitted request
spends one token from both buckets up front, so a burst of concurrent attempts cannot all pass
before the first failure is counted; a request that authenticates gets its tokens back.

State lives in this process only (one replica); quotas across replicas are a later issue.
"""

from __future__ import annotations

import math
import time
import uuid
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

    def settle(self, *, authenticated: bool) -> None:
        self.gate.settle(self, authenticated=authenticated)


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
        for key in keys:
            self._refilled(key, now).tokens -= 1.0

    def refund(self, keys: tuple[str, ...], now: float) -> None:
        for key in keys:
            bucket = self._refilled(key, now)
            bucket.tokens = min(self._burst, bucket.tokens + 1.0)


def _client_key(client_id: str | None) -> str:
    """Client ids are UUIDs; anything else shares one bucket (no client can be named so)."""
    try:
        return "client:" + str(uuid.UUID(client_id or ""))
    except ValueError:
        return "client:?"


class TokenGate:
    def __init__(self, *, max_in_flight: int, failure_burst: int, failures_per_minute: float):
        self._max_in_flight = max_in_flight
        self._failures = FailureBuckets(failure_burst, failures_per_minute)
        self.in_flight = 0

    def admit(self, client_id: str | None, source: str) -> Admission:
        """Admit a token request or raise the problem to answer instead (nothing spent)."""
        now = time.monotonic()
        keys = (_client_key(client_id), "source:" + source)
        wait = self._failures.wait_seconds(keys, now)
        if wait > 0:
            retry_after = max(1, math.ceil(min(wait, 86_400.0)))
            raise OAuthTooManyFailures(
                "Too many failed client authentications from this source or for this client "
                f"id. Check the client id and secret, then retry after {retry_after} s.",
                retry_after=retry_after,
            )
        if self.in_flight >= self._max_in_flight:
            raise OAuthOverloaded(
                "The token endpoint is busy with other requests. Retry after 1 s; a token "
                "you already hold keeps working until it expires.",
                retry_after=1,
            )
        self.in_flight += 1
        self._failures.spend(keys, now)
        return Admission(self, keys)

    def settle(self, admission: Admission, *, authenticated: bool) -> None:
        self.in_flight -= 1
        if authenticated:
            self._failures.refund(admission.keys, time.monotonic())
