"""What the sync and async clients share: URLs, query strings, answers that are not plain JSON."""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Mapping
from typing import Any, cast
from urllib.parse import quote

import httpx

from memgate_client._endpoints import Endpoint
from memgate_client.errors import UnexpectedAnswer, UnsafePathId
from memgate_client.types import AuditEvent, AuditExport, AuditReceipt, TokenResponse

USER_AGENT = "memgate-client/0.1.0"
_INVALID_TOKEN = re.compile(r'error\s*=\s*"?invalid_token"?', re.IGNORECASE)
_RECEIPT = re.compile(r"seq=(\d+)\s*;\s*hash=([0-9a-f]{64})")


def url_of(base_url: str, endpoint: Endpoint, ids: Mapping[str, str] | None = None) -> str:
    """The endpoint's absolute URL, each path id percent-encoded (`:` kept: `team:<uuid>`)."""
    path = endpoint.path
    if ids:
        path = path.format(**{name: _path_id(name, value) for name, value in ids.items()})
    return base_url.rstrip("/") + path


def _path_id(name: str, value: object) -> str:
    text = str(value)
    if text in ("", ".", ".."):
        raise UnsafePathId(f"{name} {text!r} is not an id: it would change the path it is put in")
    return quote(text, safe=":@")


def redirect_refused(response: httpx.Response) -> UnexpectedAnswer:
    """memgate never redirects an API call: following one would send this request's body (a
    memory, the token form with a client secret or the user's `subject_token`) to wherever the
    `Location` points."""
    return UnexpectedAnswer(
        f"{response.request.method} {response.request.url.path} answered "
        f"{response.status_code} to {response.headers.get('location', '(no Location)')!r}; "
        "redirects are never followed (give base_url the server's own address)"
    )


def decoded(response: httpx.Response) -> Any:
    """The JSON of a success (None when empty); anything else is an `UnexpectedAnswer`."""
    if not response.content:
        return None
    try:
        return response.json()
    except ValueError:
        kind = response.headers.get("content-type", "no content type")
        raise UnexpectedAnswer(
            f"{response.request.method} {response.request.url.path} answered "
            f"{response.status_code} with {kind}, not JSON"
        ) from None


def token_answer(response: httpx.Response) -> TokenResponse:
    answer = decoded(response)
    if not (
        isinstance(answer, dict)
        and isinstance(answer.get("access_token"), str)
        and type(answer.get("expires_in")) is int
    ):
        raise UnexpectedAnswer("the token endpoint's answer has no access_token and expires_in")
    return cast(TokenResponse, answer)  # checked above: the fields the client reads


class Cursors:
    """The page cursors an iterator was handed: one handed twice would make it ask for the same
    pages forever (with empty pages, without ever yielding), so it is refused."""

    def __init__(self) -> None:
        self._seen: set[str] = set()

    def next(self, cursor: str | None) -> str | None:
        if cursor is None:
            return None
        if cursor in self._seen:
            raise UnexpectedAnswer(f"the server handed the page cursor {cursor!r} twice")
        self._seen.add(cursor)
        return cursor


def next_seq_after(from_seq: int, next_seq: int | None) -> int | None:
    """`Audit-Next-Seq` must move forward, or the export would be asked for forever."""
    if next_seq is not None and next_seq <= from_seq:
        raise UnexpectedAnswer(
            f"the audit export from {from_seq} continues at {next_seq}: it must move forward"
        )
    return next_seq


def query(**values: Any) -> dict[str, Any]:
    """The query parameters that were given (None: left out, the server's default)."""
    return {name: value for name, value in values.items() if value is not None}


def new_idempotency_key() -> str:
    """One per logical call, reused by its retries: 32 hex characters (the API takes 1-200
    visible ASCII characters)."""
    return secrets.token_hex(16)


def token_was_rejected(response: httpx.Response) -> bool:
    """A 401 that says the token is no good (expired, revoked, keys rotated): worth one new
    token. Not `missing_token`, and not the token endpoint's own 401 (bad client secret)."""
    challenge = response.headers.get("www-authenticate", "")
    return response.status_code == 401 and bool(_INVALID_TOKEN.search(challenge))


def audit_export_of(response: httpx.Response) -> AuditExport:
    try:
        events: list[AuditEvent] = [
            json.loads(line) for line in response.text.splitlines() if line.strip()
        ]
        next_seq = response.headers.get("audit-next-seq")
        return AuditExport(events=events, next_seq=int(next_seq) if next_seq else None)
    except ValueError:
        raise UnexpectedAnswer(
            "the audit export is not NDJSON with a numeric Audit-Next-Seq"
        ) from None


def receipt_of(response: httpx.Response) -> AuditReceipt | None:
    """`Audit-Receipt: seq=<n>; hash=<64 hex>`: the call's own audit row, then the head of the
    tenant's chain (sent when the request said `Prefer: audit-receipt`)."""
    found = _RECEIPT.search(response.headers.get("audit-receipt", ""))
    return AuditReceipt(seq=int(found[1]), hash=found[2]) if found else None
