from __future__ import annotations

from litestar.testing import AsyncTestClient
from sqlalchemy import text

from service.runtime import Runtime


async def test_healthz_needs_no_token(http: AsyncTestClient) -> None:  # type: ignore[type-arg]
    response = await http.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


async def test_readyz_checks_the_migration_head(
    http: AsyncTestClient,  # type: ignore[type-arg]
    runtime: Runtime,
) -> None:
    assert (await http.get("/readyz")).json() == {"status": "ready"}
    async with runtime.engine.begin() as conn:
        await conn.execute(text("UPDATE alembic_version SET version_num = 'older'"))
    response = await http.get("/readyz")
    assert response.status_code == 503
    assert response.json() == {"status": "migrations not at head"}


async def test_every_response_carries_a_request_id(http: AsyncTestClient) -> None:  # type: ignore[type-arg]
    response = await http.get("/healthz", headers={"X-Request-Id": "abc-123"})
    assert response.headers["x-request-id"] == "abc-123"
    generated = (await http.get("/healthz")).headers["x-request-id"]
    assert len(generated) == 32
