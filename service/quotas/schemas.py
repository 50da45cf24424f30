"""The limits a platform admin sets on a tenant or on one of its clients."""

from __future__ import annotations

import math
from typing import Annotated

import msgspec

MIN_RATE = 0.0001
"""The slowest rate: one per 10,000 s (about 2.8 h). Below it a window outgrows any header a
client reads (RFC 8941 integers have at most 15 digits) and the shared bucket's arithmetic
leaves the range PostgreSQL stores (a subnormal double was refused there: red-team finding);
a limit of "nothing" is disabling the tenant, not a quota."""
Rate = Annotated[float, msgspec.Meta(ge=MIN_RATE, le=100_000)]
"""Per second, from `MIN_RATE` to 100,000."""
Burst = Annotated[int, msgspec.Meta(ge=1, le=1_000_000)]


class Limits(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=True):
    """Every field is optional: an unset field is no limit. On a client (`client_id` given)
    only the request, concurrency and token-request limits apply; embedding calls and storage
    are the tenant's. Bursts default to the rate rounded up (at least 1)."""

    requests_per_second: Rate | None = None
    """Token bucket on authenticated requests (REST and MCP alike)."""
    request_burst: Burst | None = None
    concurrent_requests: Annotated[int, msgspec.Meta(ge=1, le=10_000)] | None = None
    token_requests_per_second: Rate | None = None
    """Token bucket on tokens issued at `/oauth/token` (successful client authentications)."""
    token_burst: Burst | None = None
    embedding_calls_per_minute: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] | None = None
    """Token bucket on the embedder's calls (a memory write or a search each make one)."""
    max_memories: Annotated[int, msgspec.Meta(ge=0, le=10**12)] | None = None
    """Memories the tenant may store, every version counted: superseded and revoked versions
    are storage until they are erased or swept (a new version of a key at the cap is refused;
    forget old ones to make room)."""
    max_bytes: Annotated[int, msgspec.Meta(ge=0, le=10**15)] | None = None
    """UTF-8 bytes of what those rows store: subject, key, value, source and metadata."""

    def problems(self, *, for_client: bool) -> list[dict[str, str]]:
        """What is inconsistent (a burst without its rate; a tenant-only limit on a client)."""
        found: list[dict[str, str]] = []
        if self.request_burst is not None and self.requests_per_second is None:
            found.append({"field": "request_burst", "message": "needs requests_per_second"})
        if self.token_burst is not None and self.token_requests_per_second is None:
            found.append({"field": "token_burst", "message": "needs token_requests_per_second"})
        if for_client:
            for name in ("embedding_calls_per_minute", "max_memories", "max_bytes"):
                if getattr(self, name) is not None:
                    found.append({"field": name, "message": "a tenant limit, not a client's"})
        return found

    @property
    def empty(self) -> bool:
        return not msgspec.structs.asdict(self) or all(
            v is None for v in msgspec.structs.asdict(self).values()
        )


def burst_of(rate: float, burst: int | None) -> int:
    return burst if burst is not None else max(1, math.ceil(rate))
