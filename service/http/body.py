"""Strict requests: the query string, the media type and the JSON body.

Litestar ignores query parameters a route does not declare, accepts a body whatever its
`Content-Type` says, and converts a decoded body into the handler's `data` type with msgspec in
lax mode, which is meant for query strings and forms: `"k": "3"` becomes 3, `"ttl_seconds":
"60"` becomes 60 and `"valid_from": 1700000000` becomes a datetime. Here, before any of that:

- a query parameter the route does not declare is a 422 naming it and the ones it takes (like
  an unknown JSON field, so a typo never silently drops a filter);
- a route with a JSON body takes `application/json` (or `application/*+json`) in UTF-8, else 415;
- the body is decoded strictly against the handler's struct; a mismatch is the usual 422
  problem, a malformed id is 400 `malformed-id` (as in a path), and undecodable JSON is 400
  `malformed-request` saying why (a lone UTF-16 surrogate is named as such).
"""

from __future__ import annotations

import re
from typing import Any

import msgspec
from litestar import Litestar, Request
from litestar.exceptions import ValidationException
from litestar.routes import HTTPRoute

from service.problems import InvalidRequest, MalformedRequest, UnsupportedMediaType

BODY_CHECK = "memgate.body_check"
"""Key in a route handler's `opt`: a function of the body bytes that checks it instead of the
strict decode into the handler's struct (the batch write checks item by item), raising msgspec's
errors for the body's own faults, or a `Problem`."""
QUERY_PARAMETERS = "memgate.query_parameters"
"""Key in each route handler's `opt`: the query parameter names it declares (set by
`declare_query_parameters`)."""

_AT_PATH = re.compile(r"^(?P<message>.*) - at `\$(?P<path>[^`]*)`$")
# A `\uD800`-`\uDBFF` escape not followed by a low one, or a `\uDC00`-`\uDFFF` escape not
# preceded by a high one: JSON allows the escape, Unicode text cannot hold the code point.
_LONE_SURROGATE = re.compile(
    r"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
    r"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}"
)


def _field(path: str) -> str:
    return path.lstrip(".") or "body"


def declare_query_parameters(app: Litestar) -> None:
    """Record on every HTTP handler which query parameters it takes (its own and its
    dependencies'), as Litestar resolved them; `strict_request` refuses any other."""
    for route in app.routes:
        if not isinstance(route, HTTPRoute):
            continue
        for handler, kwargs_model in route.route_handler_map.values():
            handler.opt[QUERY_PARAMETERS] = frozenset(
                parameter.field_alias for parameter in kwargs_model.expected_query_params
            )


def _check_query(request: Request[Any, Any, Any]) -> None:
    declared: frozenset[str] | None = request.route_handler.opt.get(QUERY_PARAMETERS)
    if declared is None:
        return
    # Echoed back to the caller: at most ten names, each cut to 64 characters.
    unknown = [name[:64] for name in sorted(set(request.query_params) - declared)][:10]
    if not unknown:
        return
    takes = (
        f"it takes {', '.join(sorted(declared))}"
        if declared
        else "this route takes no query parameters"
    )
    raise InvalidRequest(
        f"The request did not validate: unknown query parameter(s) {', '.join(unknown)}; {takes}.",
        errors=[
            {"field": name, "source": "query", "message": "Unknown query parameter"}
            for name in unknown
        ],
    )


def _check_media_type(request: Request[Any, Any, Any]) -> None:
    raw = request.headers.get("content-type", "")
    media_type, _, params = raw.partition(";")
    media_type = media_type.strip().lower()
    is_json = media_type == "application/json" or (
        media_type.startswith("application/") and media_type.endswith("+json")
    )
    charset = ""
    for param in params.split(";"):
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset":
            charset = value.strip().strip('"').lower()
    if is_json and charset in ("", "utf-8", "utf8"):
        return
    sent = f"'{raw[:100]}'" if raw else "no Content-Type"
    raise UnsupportedMediaType(
        f"This route takes a JSON body: send it with 'Content-Type: application/json' "
        f"(UTF-8; charset=utf-8 or none); the request had {sent}.",
        accepted=["application/json"],
    )


def _undecodable(body: bytes) -> MalformedRequest:
    lone = _LONE_SURROGATE.search(body.decode("utf-8", "replace"))
    if lone is not None:
        return MalformedRequest(
            f"The JSON body holds a lone UTF-16 surrogate escape ({lone.group(0)}): JSON text "
            "must be valid Unicode. Pair each \\ud800-\\udbff escape with a following "
            "\\udc00-\\udfff one (one character outside the BMP), or remove it."
        )
    return MalformedRequest(
        "The request body is not valid JSON (or not UTF-8). Send a JSON object with "
        "'Content-Type: application/json'."
    )


async def strict_request(request: Request[Any, Any, Any]) -> None:
    """`before_request` hook: runs after authentication and guards, before Litestar's own (lax)
    conversion."""
    _check_query(request)
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
    _check_media_type(request)
    check = request.route_handler.opt.get(BODY_CHECK)
    try:
        if check is not None:
            check(body)
        else:
            msgspec.json.decode(body, type=data_field.annotation, strict=True)
    except msgspec.ValidationError as exc:
        match = _AT_PATH.match(str(exc))
        message, path = (match["message"], match["path"]) if match else (str(exc), "")
        raise ValidationException(
            detail="Validation failed",
            extra=[{"key": _field(path), "source": "body", "message": message}],
        ) from None
    except msgspec.DecodeError:
        raise _undecodable(body) from None
    except RecursionError:
        raise MalformedRequest("The JSON body is nested too deeply.") from None
