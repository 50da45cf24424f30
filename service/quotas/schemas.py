"""The limits a platform admin sets on a tenant or on one of its clients."""

from __future__ import annotations

import math
from typing import Annotated

import msgspec

Rate = Annotated[float, msgspec.Meta(gt=0, le=100_000)]
"""Per second: more than zero (a limit of "nothing" is disabling the tenant, not a quota)."""
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
    """Live memories (neither superseded nor revoked) the tenant may hold."""
    max_bytes: Annotated[int, msgspec.Meta(ge=0, le=10**15)] | None = None
    """UTF-8 bytes of the values of those memories."""

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
