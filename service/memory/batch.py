"""The batch write's body, item by item: every bad item is named, not only the first.

A strict decode of the whole body stops at its first mismatch; a batch answers 422
`batch-rejected` listing every failing item (its index, and the problem the single write would
have answered for it), so the body is decoded as a list of raw items first and each item on its
own (service/http/body.py calls `decode_batch` for the route instead of its generic decode).
"""

from __future__ import annotations

import re

import msgspec

from service.db.types import PATTERN_MEANINGS
from service.memory.problems import BatchRejected
from service.memory.schemas import MemoryBatch, MemoryCreate
from service.problems import InvalidRequest, MalformedId, Problem

_AT_PATH = re.compile(r"^(?P<message>.*) - at `\$(?P<path>[^`]*)`$")
MAX_LISTED = 20
"""Indexes the detail names (`errors` lists every one)."""


class _Shell(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    items: list[msgspec.Raw]


def decode_batch(body: bytes) -> None:
    """Check `body` as a `MemoryBatch`, item by item. The shell's own faults (not JSON, no
    `items`, an unknown field) raise msgspec's errors, answered like any body's; faulty items
    raise `BatchRejected`."""
    shell = msgspec.json.decode(body, type=_Shell, strict=True)
    if not shell.items:
        msgspec.json.decode(body, type=MemoryBatch, strict=True)  # says "at least 1 item"
    failures: list[tuple[int, Problem]] = []
    for index, raw in enumerate(shell.items):
        try:
            msgspec.json.decode(raw, type=MemoryCreate, strict=True)
        except msgspec.ValidationError as exc:
            failures.append((index, _item_problem(str(exc))))
    if failures:
        raise batch_rejected(failures, len(shell.items))


def _item_problem(error: str) -> Problem:
    """The problem the single write answers for this item's body (service/http/errors.py)."""
    match = _AT_PATH.match(error)
    message, path = (match["message"], match["path"]) if match else (error, "")
    for pattern, meaning in PATTERN_MEANINGS.items():
        message = message.replace(f"`str` matching regex {pattern!r}", meaning)
    field = path.lstrip(".") or "body"
    errors = [{"field": field, "source": "body", "message": message}]
    if message.startswith("Invalid UUID"):
        return MalformedId(
            f"{field}: not a UUID. Ids look like 0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b.",
            errors=errors,
        )
    return InvalidRequest(f"The request did not validate: {field}: {message}", errors=errors)


def batch_rejected(failures: list[tuple[int, Problem]], total: int) -> BatchRejected:
    """The batch's 422: every failing item as the single write would have answered it."""
    errors = [
        {
            "index": index,
            "status": problem.status,
            "type": problem.type_uri(),
            "title": problem.title,
            "detail": problem.detail,
        }
        for index, problem in failures
    ]
    listed = ", ".join(str(index) for index, _ in failures[:MAX_LISTED])
    more = " …" if len(failures) > MAX_LISTED else ""
    return BatchRejected(
        f"{len(failures)} of the {total} items failed (indexes {listed}{more}); 'errors' says "
        "why, per item. Nothing was written: fix them and send the batch again.",
        errors=errors,
    )
