"""When to send a request again, and after how long (shared by the sync and async clients)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import httpx

from memgate_client.errors import PROBLEM_BASE_URI, retry_after_of

RETRY_STATUSES = frozenset({429, 502, 503, 504})
IN_FLIGHT = PROBLEM_BASE_URI + "idempotency-key-in-flight"
TOO_MANY_FAILURES = PROBLEM_BASE_URI + "oauth-too-many-failures"
"""A 429 for wrong credentials sent too often: the same credentials again would not help."""


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries with jittered exponential backoff, for idempotent requests only.

    attempts: the most times one request is sent (1: never again).
    backoff: the first wait's ceiling in seconds; it doubles per retry up to `max_backoff`,
        and the wait is drawn uniformly below it ("full jitter": clients that failed together
        do not come back together).
    max_retry_after: the longest `Retry-After` honoured; an answer asking for more is raised
        at once (RateLimited / ServiceUnavailable with its `retry_after`), rather than sleeping
        for minutes behind the caller's back.
    """

    attempts: int = 4
    backoff: float = 0.25
    max_backoff: float = 4.0
    max_retry_after: float = 30.0
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.backoff < 0 or self.max_backoff < 0:
            raise ValueError("attempts must be at least 1, backoff and max_backoff at least 0")

    def _jittered(self, retry: int) -> float:
        return self.rng.uniform(0, min(self.max_backoff, self.backoff * 2**retry))

    def after_error(self, sent: int, retryable: bool) -> float | None:
        """The wait before sending again after a connection error, None to give up. `sent`:
        how many times the request was sent so far."""
        if not retryable or sent >= self.attempts:
            return None
        return self._jittered(sent - 1)

    def after_answer(self, sent: int, retryable: bool, response: httpx.Response) -> float | None:
        """The wait before sending again after this error answer, None to raise it."""
        if not retryable or sent >= self.attempts or not _transient(response):
            return None
        asked = retry_after_of(_problem_body(response), response.headers)
        if asked is None:
            return self._jittered(sent - 1)
        if asked > self.max_retry_after:
            return None
        # A little jitter on top, so the callers a limit turned away do not return in step.
        return asked + self.rng.uniform(0, self.backoff)


def _transient(response: httpx.Response) -> bool:
    if response.status_code in RETRY_STATUSES:
        return _problem_body(response).get("type") != TOO_MANY_FAILURES
    # The first call with this Idempotency-Key is still running: ask again for its answer.
    return response.status_code == 409 and _problem_body(response).get("type") == IN_FLIGHT


def _problem_body(response: httpx.Response) -> dict[str, object]:
    if "json" not in response.headers.get("content-type", ""):
        return {}
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


NO_RETRIES = RetryPolicy(attempts=1)
