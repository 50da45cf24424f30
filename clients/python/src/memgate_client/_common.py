"""What the sync and async clients share: URLs, query strings, answers that are not plain JSON."""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import httpx

from memgate_client._endpoints import Endpoint
from memgate_client.types import AuditEvent, AuditExport, AuditReceipt

USER_AGENT = "memgate-client/0.1.0"
_INVALID_TOKEN = re.compile(r'error\s*=\s*"?invalid_token"?', re.IGNORECASE)
_RECEIPT = re.compile(r"seq=(\d+)\s*;\s*hash=([0-9a-f]{64})")


def url_of(base_url: str, endpoint: Endpoint, ids: Mapping[str, str] | None = None) -> str:
    """The endpoint's absolute URL, each path id percent-encoded (`:` kept: `team:<uuid>`)."""
    path = endpoint.path
    if ids:
        path = path.format(**{name: quote(str(value), safe=":@") for name, value in ids.items()})
    return base_url.rstrip("/") + path


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
    events: list[AuditEvent] = [
        json.loads(line) for line in response.text.splitlines() if line.strip()
    ]
    next_seq = response.headers.get("audit-next-seq")
    return AuditExport(events=events, next_seq=int(next_seq) if next_seq else None)


def receipt_of(response: httpx.Response) -> AuditReceipt | None:
    """`Audit-Receipt: seq=<n>; hash=<64 hex>`: the call's own audit row, then the head of the
    tenant's chain (sent when the request said `Prefer: audit-receipt`)."""
    found = _RECEIPT.search(response.headers.get("audit-receipt", ""))
    return AuditReceipt(seq=int(found[1]), hash=found[2]) if found else None
