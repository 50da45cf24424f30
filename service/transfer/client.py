"""A small HTTP client of a running memgate for import and export: a client-credentials token
(asked again before it expires and on a 401), and retries where a retry is safe — a batch under
its `Idempotency-Key` (429, 503, 409 in flight, a dropped connection), a page read always.
Not the typed client distribution (clients/python): the server package never imports that."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import httpx

TOKEN_MARGIN = 30.0
"""Seconds before its expiry a token is replaced."""
RETRIES = 8
"""Attempts of one request that fails in a retryable way, with backoff (Retry-After wins)."""
RETRYABLE = frozenset({409, 429, 502, 503, 504})


class TransferFailed(Exception):
    """What stops an import or export: one line for stderr."""


@dataclass
class Credentials:
    client_id: str
    secret: str


@dataclass
class Server:
    url: str
    credentials: Credentials
    timeout: float = 60.0
    _http: httpx.Client = field(init=False)
    _token: str | None = field(default=None, init=False)
    _expires: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        self.url = self.url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, timeout=self.timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def token(self) -> str:
        if self._token is None or time.monotonic() > self._expires - TOKEN_MARGIN:
            self._token = None
            answer = self._send(
                "POST",
                "/oauth/token",
                data={"grant_type": "client_credentials"},
                auth=(self.credentials.client_id, self.credentials.secret),
            )
            if answer.is_error:
                raise TransferFailed(
                    f"{self.url}/oauth/token refused the client {self.credentials.client_id} "
                    f"({answer.status_code}): {_said(answer)}"
                )
            body = answer.json()
            self._token = str(body["access_token"])
            self._expires = time.monotonic() + float(body.get("expires_in", 600))
        return self._token

    def call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        """The request with a fresh token, retried while the answer says a retry will do."""
        refreshed = False
        for attempt in range(RETRIES):
            sent = {"Authorization": f"Bearer {self.token()}", **(headers or {})}
            answer = self._send(method, path, json=json, params=params, headers=sent)
            if answer.status_code == 401 and not refreshed:  # expired early, or keys rotated
                self._token, refreshed = None, True
                continue
            if answer.status_code not in RETRYABLE or attempt == RETRIES - 1:
                return answer
            time.sleep(_wait(answer, attempt))
        raise AssertionError("unreachable")  # the loop returns on its last attempt

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        for attempt in range(RETRIES):
            try:
                return self._http.request(method, path, **kwargs)
            except httpx.TransportError as exc:  # dropped connection, restart: the key holds
                if attempt == RETRIES - 1:
                    raise TransferFailed(
                        f"cannot reach {self.url} ({exc.__class__.__name__}); is memgate serve "
                        "running there? (--url, or MEMGATE_PUBLIC_URL)"
                    ) from None
                time.sleep(min(0.25 * 2.0**attempt, 5.0))
        raise AssertionError("unreachable")


def _wait(answer: httpx.Response, attempt: int) -> float:
    try:
        said = float(str(answer.headers.get("retry-after", "")))
    except ValueError:
        return min(0.25 * 2.0**attempt, 5.0)
    return min(said, 30.0)


def _said(answer: httpx.Response) -> str:
    try:
        body = answer.json()
    except ValueError:
        return answer.text[:300]
    if isinstance(body, dict):
        return str(body.get("detail") or body.get("error_description") or body)[:300]
    return str(body)[:300]


def problem_detail(answer: httpx.Response) -> str:
    return _said(answer)
