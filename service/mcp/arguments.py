"""Strict decoding of tool arguments into the tool's struct, with REST's problems.

REST decodes a body with `msgspec.json.decode(..., strict=True)` (service/http/body.py); a tool's
arguments arrive already parsed as JSON values, so `msgspec.convert(..., strict=True)` does the
same checks: no `"3"` for 3, no number for a date, no unknown field. A mismatch is the same
problem REST answers — 422 `invalid-request` naming the field, or 400 `malformed-id` when the
only fault is an id that is not a UUID — in the same words (service/http/errors.py).
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

import msgspec

from service.db.types import PATTERN_MEANINGS
from service.problems import InvalidRequest, MalformedId, Problem

T = TypeVar("T", bound=msgspec.Struct)

_AT_PATH = re.compile(r"^(?P<message>.*) - at `\$(?P<path>[^`]*)`$")


def decode(arguments: dict[str, Any] | None, into: type[T]) -> T:
    try:
        return msgspec.convert(arguments or {}, into, strict=True)
    except msgspec.ValidationError as exc:
        raise _problem(str(exc)) from None


def _readable(message: str) -> str:
    for pattern, meaning in PATTERN_MEANINGS.items():
        message = message.replace(f"`str` matching regex {pattern!r}", meaning)
    return message


def _problem(error: str) -> Problem:
    match = _AT_PATH.match(error)
    message, path = (match["message"], match["path"]) if match else (error, "")
    field = path.lstrip(".") or "arguments"
    errors = [{"field": field, "source": "arguments", "message": _readable(message)}]
    if message.startswith("Invalid UUID"):
        return MalformedId(
            f"{field}: not a UUID. Ids look like 0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b.",
            errors=errors,
        )
    return InvalidRequest(
        f"The request did not validate: {field}: {errors[0]['message']}. The tool's input "
        "schema (tools/list) names every field it takes and its type.",
        errors=errors,
    )
