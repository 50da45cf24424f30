"""The answers of a limit that bites: 429 with `Retry-After` and the IETF rate-limit fields
(draft-ietf-httpapi-ratelimit-headers-12: `RateLimit-Policy: "<name>";q=<quota>;w=<window>`
and `RateLimit: "<name>";r=<remaining>;t=<reset>`, structured fields)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from service.problems import Problem

MAX_RETRY_SECONDS = 86_400
"""The longest `Retry-After` answered (a day); the slowest rate refills faster than that."""


@dataclass(frozen=True)
class Bitten:
    """Which limit refused the call, for the answer's words and headers."""

    policy: str
    """The policy name (`tenant-requests`, `client-concurrency`, `tenant-memories` ...)."""
    quota: int
    """The quota in the policy's unit (requests per window, slots, memories, bytes)."""
    window_seconds: int | None
    """The window a rate's quota is counted over; None for concurrency and storage."""
    retry_after: float
    """Seconds until the limit can admit again (at least 1 in the header)."""
    what: str
    """The limit in words, e.g. "20 requests per second (burst 40)"."""

    @property
    def retry_seconds(self) -> int:
        # Bounded: a header value a client can parse, whatever a limit's arithmetic says.
        return min(MAX_RETRY_SECONDS, max(1, math.ceil(self.retry_after)))

    def headers(self) -> dict[str, str]:
        policy = f'"{self.policy}";q={self.quota}'
        if self.window_seconds is not None:
            policy += f";w={self.window_seconds}"
        return {
            "Retry-After": str(self.retry_seconds),
            "RateLimit-Policy": policy,
            "RateLimit": f'"{self.policy}";r=0;t={self.retry_seconds}',
        }


class RateLimited(Problem, slug="rate-limited", status=429, title="Rate limit reached"):
    """A rate or concurrency limit of the tenant or of the client refused the call before any
    work: nothing was changed. `limit` names it, `quota` and `window_seconds` give its value,
    `retry_after` (also `Retry-After`) says when to retry; `RateLimit-Policy` and `RateLimit`
    carry the same in the IETF draft's form."""

    def __init__(self, detail: str, bitten: Bitten) -> None:
        super().__init__(
            detail,
            limit=bitten.policy,
            quota=bitten.quota,
            window_seconds=bitten.window_seconds,
            retry_after=bitten.retry_seconds,
        )
        self.bitten = bitten

    def headers(self) -> dict[str, str]:
        return self.bitten.headers()


class QuotaExceeded(RateLimited, slug="quota-exceeded", status=429, title="Storage quota reached"):
    """The write would take the tenant past its stored-memories or stored-bytes quota; it was
    refused and nothing was written. Forget (delete) memories or ask the platform operator for
    a larger quota; `limit` names which, `quota` its value."""


def rate_limited(bitten: Bitten) -> RateLimited:
    return RateLimited(
        f"Rate limit '{bitten.policy}' reached: {bitten.what}. Nothing was done; retry after "
        f"{bitten.retry_seconds} s.",
        bitten,
    )


def quota_exceeded(bitten: Bitten, used: int) -> QuotaExceeded:
    return QuotaExceeded(
        f"Storage quota '{bitten.policy}' reached: the tenant may hold {bitten.what} and this "
        f"write would make {used}. Nothing was written; delete memories the tenant no longer "
        "needs, or ask the platform operator to raise the quota.",
        bitten,
    )
