"""The declared-problems check over HTTP (service/http/answers.py): a problem answer whose type
its route's operation does not declare is recorded; declared ones, other bodies and routes
that are not operations are not; switched off, the app is not even wrapped."""

from __future__ import annotations

import json
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from service.auth import operations as auth_ops
from service.http.answers import check_answered_problems
from service.memory.problems import MemoryNotFound
from service.operations import UNDECLARED, Operation, check_answers
from service.problems import ServiceUnavailable


@pytest.fixture
def recorded() -> Iterator[list[str]]:
    """What the check recorded, taken away again before the suite's own check looks."""
    UNDECLARED.clear()
    found: list[str] = []
    yield found
    UNDECLARED.clear()


def _app(
    operation: Operation | None, status: int, content_type: bytes, body: dict[str, Any]
) -> Any:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        if operation is not None:  # routing names the handler, as Litestar does
            scope["route_handler"] = SimpleNamespace(opt={"operation": operation})
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", content_type)],
            }
        )
        payload = json.dumps(body).encode()
        await send({"type": "http.response.body", "body": payload[:5], "more_body": True})
        await send({"type": "http.response.body", "body": payload[5:], "more_body": False})

    return app


async def _call(app: Any) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    wrapped: Any = check_answered_problems(app)
    await wrapped({"type": "http", "path": "/x"}, receive, send)
    return sent


PROBLEM = b"application/problem+json"


async def test_an_undeclared_problem_is_recorded_naming_operation_and_type(
    recorded: list[str],
) -> None:
    sent = await _call(_app(auth_ops.JWKS, 404, PROBLEM, {"type": MemoryNotFound.type_uri()}))
    recorded.extend(UNDECLARED)
    assert recorded == [f"auth.jwks (getJwks) answered {MemoryNotFound.type_uri()}"]
    assert [m["type"] for m in sent] == [
        "http.response.start",
        "http.response.body",
        "http.response.body",
    ]


async def test_declared_problems_and_other_answers_are_not(recorded: list[str]) -> None:
    await _call(_app(auth_ops.JWKS, 503, PROBLEM, {"type": ServiceUnavailable.type_uri()}))
    await _call(_app(auth_ops.JWKS, 404, b"application/json", {"type": MemoryNotFound.type_uri()}))
    await _call(_app(auth_ops.JWKS, 200, PROBLEM, {"type": MemoryNotFound.type_uri()}))
    await _call(_app(None, 404, PROBLEM, {"type": MemoryNotFound.type_uri()}))  # not an operation
    recorded.extend(UNDECLARED)
    assert recorded == []


def test_switched_off_the_app_is_not_wrapped() -> None:
    app = _app(auth_ops.JWKS, 200, b"application/json", {})
    check_answers(False)
    try:
        assert check_answered_problems(app) is app
    finally:
        check_answers()
    assert check_answered_problems(app) is not app
