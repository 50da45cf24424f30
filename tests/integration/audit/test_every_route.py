"""No route escapes the audit log: every operation of openapi.yaml, called once, leaves exactly
one row naming its route template and its declared action, and a route without an action
cannot even be mounted. The audit write itself is never skipped: when it fails, the caller gets
503 and nothing the call did is kept."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from litestar import get
from sqlalchemy.ext.asyncio import AsyncEngine

from service.app import create_app
from service.http.audit import check_every_route_is_an_operation
from service.runtime import Runtime
from tests.fixtures.api import Api
from tests.integration.audit.support import owner_execute, rows_by_request
from tests.integration.memory.support import assert_problem, count_memories

OPENAPI = Path(__file__).parents[3] / "openapi.yaml"
EXEMPT = {"/healthz", "/readyz"}
"""Probes: polled every few seconds, carry no tenant data."""


def _operations() -> list[tuple[str, str]]:
    document: dict[str, Any] = yaml.safe_load(OPENAPI.read_text())
    return [
        (method.upper(), path)
        for path, item in document["paths"].items()
        for method in item
        if method in {"get", "post", "put", "patch", "delete"}
    ]


def _concrete(path: str) -> str:
    """Path parameters filled in: a random id, or the one role there is."""
    parts = path.split("/")
    return "/".join(
        ("auditor" if part == "{role}" else str(uuid.uuid4())) if part.startswith("{") else part
        for part in parts
    )


async def test_every_operation_leaves_exactly_one_row(api: Api, owner_engine: AsyncEngine) -> None:
    operations = _operations()
    assert len(operations) >= 20
    sent: dict[str, tuple[str, str]] = {}
    for method, path in operations:
        request_id = uuid.uuid4().hex
        await api.http.request(
            method,
            _concrete(path),
            headers={**api.admin.headers, "X-Request-Id": request_id},
            json={} if method in {"POST", "PUT", "PATCH"} else None,
        )
        sent[request_id] = (method, path)
    rows = await rows_by_request(owner_engine)
    app = create_app()
    declared = {
        (next(iter(handler.http_methods)), route.path): handler.opt.get("action")
        for route in app.routes
        for handler in getattr(route, "route_handlers", [])
    }
    for request_id, (method, path) in sent.items():
        found = rows.get(request_id, [])
        if path in EXEMPT:
            assert found == [], path
            continue
        assert len(found) == 1, (method, path, found)
        row = found[0]
        assert row["route"] == path
        assert row["method"] == method
        expected_action = next(
            action
            for (m, p), action in declared.items()
            if m == method and p.replace(":str", "").replace(":uuid", "") == path
        )
        assert row["action"] == expected_action, (method, path)


def test_a_route_without_an_audit_action_cannot_be_mounted(runtime: Runtime) -> None:
    @get("/v1/unaudited")
    async def unaudited() -> dict[str, str]:
        return {}

    app = create_app(runtime)
    app.register(unaudited)
    with pytest.raises(RuntimeError, match=r"must be bound to an Operation.*GET /v1/unaudited"):
        check_every_route_is_an_operation(app)


def test_a_route_naming_an_action_but_no_operation_cannot_be_mounted(runtime: Runtime) -> None:
    """An audit action alone is not enough: the scope, the policy check and the problems come
    from the declaration, so a hand-made route could skip them."""

    @get("/v1/hand-made", opt={"action": "memory.search"})
    async def hand_made() -> dict[str, str]:
        return {}

    app = create_app(runtime)
    app.register(hand_made)
    with pytest.raises(RuntimeError, match="GET /v1/hand-made"):
        check_every_route_is_an_operation(app)


async def test_a_failed_audit_write_fails_the_call_and_keeps_nothing(
    api: Api, owner_engine: AsyncEngine
) -> None:
    alice = await api.new_agent("alice")
    before = await count_memories(api.runtime)
    await owner_execute(
        owner_engine,
        "REVOKE EXECUTE ON FUNCTION audit_append(uuid, text, text, text, text, text[], text, "
        "text, text[], text, text, text, uuid[], integer, text, text, integer, bigint) "
        "FROM memgate_app",
    )
    memory = {"subject": "service:billing", "kind": "fact", "key": "lost", "value": "never kept"}
    response = await api.http.post("/v1/memories", json=memory, headers=alice.headers)
    problem = assert_problem(response, 503, "service-unavailable")
    assert "audit" in problem["detail"]
    assert response.headers["retry-after"] == "1"
    assert await count_memories(api.runtime) == before
    # Reads are refused the same way: no answer leaves unrecorded.
    listed = await api.http.get("/v1/memories", headers=alice.headers)
    assert_problem(listed, 503, "service-unavailable")
    assert "items" not in listed.text
