"""The declared-problems check over HTTP: every problem a route answers must be one its
operation declares (`Operation.all_problems()`, which the OpenAPI document lists per operation).

Only installed while `service.operations.check_answers()` is on (the test suite): it reads the
answer as the caller gets it, after every middleware, so a problem from authentication, a
guard, validation, a handler or the audit adapter is seen alike. Answers of routes that are not
operations (unmatched paths, `/schema`, probes) are not checked.
"""

from __future__ import annotations

import json
from collections.abc import MutableMapping
from typing import Any, cast

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from service.http.audit import operation_of
from service.operations import answered, checking_answers

_PROBLEM_JSON = b"application/problem+json"
_MAX_BODY = 65_536
"""A problem body is small; a longer one is not parsed (and so not checked)."""


def _is_problem(message: Message) -> bool:
    headers: list[tuple[bytes, bytes]] = list(cast(Any, message).get("headers", ()))
    for name, value in headers:
        if name.lower() == b"content-type":
            return bool(value.split(b";", 1)[0].strip().lower() == _PROBLEM_JSON)
    return False


def _problem_type(body: bytes) -> str | None:
    try:
        parsed = json.loads(body)
    except ValueError:
        return None
    kind = parsed.get("type") if isinstance(parsed, dict) else None
    return kind if isinstance(kind, str) else None


def check_answered_problems(app: ASGIApp) -> ASGIApp:
    """`app`, noting each problem answer against its route's operation (when checking)."""
    if not checking_answers():
        return app

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await app(scope, receive, send)
            return
        body: bytearray | None = None

        async def watched_send(message: Message) -> None:
            nonlocal body
            if message["type"] == "http.response.start":
                body = bytearray() if message["status"] >= 400 and _is_problem(message) else None
            elif message["type"] == "http.response.body" and body is not None:
                body += message.get("body", b"")
                if len(body) > _MAX_BODY:
                    body = None
                elif not message.get("more_body", False):
                    _note(cast(MutableMapping[str, Any], scope), bytes(body))
                    body = None
            await send(message)

        await app(scope, receive, watched_send)

    return middleware


def _note(scope: MutableMapping[str, Any], body: bytes) -> None:
    operation = operation_of(scope)
    problem_type = _problem_type(body)
    if operation is not None and problem_type is not None:
        answered(operation, problem_type)
