"""Strict JSON bodies.

Litestar converts a decoded body into the handler's `data` type with msgspec in lax mode, which
is meant for query strings and forms: `"k": "3"` becomes 3, `"ttl_seconds": "60"` becomes 60 and
`"valid_from": 1700000000` becomes a datetime. JSON carries its own types, so every typed JSON
body is first decoded strictly against the same struct; a mismatch is the usual 422 problem.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec
from litestar import Request
from litestar.exceptions import ValidationException

_AT_PATH = re.compile(r"^(?P<message>.*) - at `\$(?P<path>[^`]*)`$")


def _field(path: str) -> str:
    return path.lstrip(".") or "body"


async def strict_json_body(request: Request[Any, Any, Any]) -> None:
    """`before_request` hook: runs after authentication and guards, before Litestar's own (lax)
    conversion. Malformed JSON is left to Litestar, which answers `malformed-request`."""
    data_field = request.route_handler.parsed_data_field
    if data_field is None or not (
        isinstance(data_field.annotation, type)
        and issubclass(data_field.annotation, msgspec.Struct)
    ):
        return
    body = await request.body()
    if not body.strip():
        raise ValidationException(
            detail="Validation failed",
            extra=[
                {"key": "body", "source": "body", "message": "Expected a JSON object, got nothing"}
            ],
        )
    try:
        msgspec.json.decode(body, type=data_field.annotation, strict=True)
    except msgspec.ValidationError as exc:
        match = _AT_PATH.match(str(exc))
        message, path = (match["message"], match["path"]) if match else (str(exc), "")
        raise ValidationException(
            detail="Validation failed",
            extra=[{"key": _field(path), "source": "body", "message": message}],
        ) from None
    except msgspec.DecodeError:
        return
