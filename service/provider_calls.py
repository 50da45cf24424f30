"""One POST of JSON to a provider memgate is configured with (an embedding endpoint, a
summarizer), for both of them: the provider is untrusted input, so its answer is bounded in
time and in size before it is parsed.

- Each attempt, body included, ends within `attempt_seconds` (httpx's own timeout bounds each
  read, so a provider trickling a byte at a time would hold the call for ever).
- The body is asked for uncompressed, read in chunks and dropped past `max_bytes` (a huge
  answer would be held in memory whole, then parsed); a compressed one is refused.
- Transient failures (no answer, 408, 429, 5xx, an attempt out of time) are retried
  `retries` times with a short backoff; any other error status is not.

Each caller turns the outcome into its own problem (`ProviderRefused`, `ProviderUnreachable`,
`ProviderAnswerInvalid`), with words for its own callers.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})
IDENTITY = frozenset({"identity", ""})


class ProviderRefused(Exception):
    """The provider answered a non-transient error status."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


class ProviderUnreachable(Exception):
    """No usable answer after every attempt (unreachable, transient errors, out of time)."""


class ProviderAnswerInvalid(Exception):
    """The answer is unusable: `reason` is `not-json`, `too-large` (larger than the caller
    accepts) or `compressed` (memgate asked for an uncompressed answer)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


async def post_json(
    client: httpx.AsyncClient,
    path: str,
    payload: dict[str, Any],
    *,
    retries: int,
    attempt_seconds: float,
    max_bytes: int,
) -> Any:
    """The provider's parsed JSON answer, or one of the three exceptions above."""
    for attempt in range(retries + 1):
        try:
            async with asyncio.timeout(attempt_seconds):
                status, body = await _post_once(client, path, payload, max_bytes)
        except (httpx.HTTPError, TimeoutError):
            status, body = None, b""
        if status is not None and status not in TRANSIENT_STATUS:
            if status >= 400:
                raise ProviderRefused(status)
            try:
                return json.loads(body)
            except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
                raise ProviderAnswerInvalid("not-json") from None
        if attempt < retries:
            await asyncio.sleep(0.2 * 2**attempt)
    raise ProviderUnreachable


async def _post_once(
    client: httpx.AsyncClient, path: str, payload: dict[str, Any], max_bytes: int
) -> tuple[int, bytes]:
    # Uncompressed only: httpx would inflate a compressed body chunk by chunk, and one 64 KiB
    # chunk of a gzip bomb inflates to ~64 MiB before any size check could see it.
    headers = {"Accept-Encoding": "identity"}
    async with client.stream("POST", path, json=payload, headers=headers) as answer:
        if answer.status_code >= 400:
            return answer.status_code, b""  # an error's body is never read
        if answer.headers.get("content-encoding", "identity").lower() not in IDENTITY:
            raise ProviderAnswerInvalid("compressed")
        body = bytearray()
        async for chunk in answer.aiter_bytes():  # identity: the bytes as they came
            body += chunk
            if len(body) > max_bytes:
                raise ProviderAnswerInvalid("too-large")
        return answer.status_code, bytes(body)
