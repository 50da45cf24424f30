from __future__ import annotations

import pytest
import structlog
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.fixtures.api import TestClient


async def test_healthz_needs_no_token(http: TestClient) -> None:
    response = await http.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


async def test_readyz_checks_the_migration_head(
    http: TestClient,
    owner_engine: AsyncEngine,
) -> None:
    assert (await http.get("/readyz")).json() == {"status": "ok"}
    async with owner_engine.begin() as conn:
        await conn.execute(text("UPDATE alembic_version SET version_num = 'older'"))
    response = await http.get("/readyz")
    assert response.status_code == 503
    assert response.json() == {"status": "not ready"}


async def test_every_response_carries_a_request_id(http: TestClient) -> None:
    response = await http.get("/healthz", headers={"X-Request-Id": "abc-123"})
    assert response.headers["x-request-id"] == "abc-123"
    generated = (await http.get("/healthz")).headers["x-request-id"]
    assert len(generated) == 32
    # Only ASCII letters, digits and dashes are echoed (the id is stored in audit rows).
    for unfit in ("caf\xe9-1".encode("latin-1"), b"a b", b"id;drop"):
        echoed = (await http.get("/healthz", headers={b"X-Request-Id": unfit})).headers
        assert echoed["x-request-id"].encode("latin-1") != unfit
        assert len(echoed["x-request-id"]) == 32


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [("GET", "/v1/memories", 401), ("GET", "/v1/nothing", 404), ("GET", "/oauth/token", 405)],
)
async def test_refusals_are_logged_with_their_status_and_carry_the_request_id(
    http: TestClient,
    method: str,
    path: str,
    status: int,
) -> None:
    """Red-team round 2, F6: before, a 401 was logged as 500 and 404/405 not at all."""
    merge = [structlog.contextvars.merge_contextvars]
    with structlog.testing.capture_logs(processors=merge) as events:
        response = await http.request(method, path, headers={"X-Request-Id": "trace-123"})
    assert response.status_code == status
    assert response.headers["x-request-id"] == "trace-123"
    logged = [event for event in events if event.get("event") == "request"]
    assert [(event["status"], event["request_id"]) for event in logged] == [(status, "trace-123")]
