"""Review item 14: what the HTTP edge tells callers and bystanders.

Authenticated answers must not be cached or sniffed; the server does not name its software;
metrics (every tenant's activity by route) are not on the public listener; probes say only
whether they are ready, and the reason goes to the log."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import httpx
import pytest
import structlog
from litestar.testing import AsyncTestClient
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.http.server import listener_config
from service.observability.metrics import create_metrics_app
from tests.fixtures.api import Api, TestClient


async def test_answers_are_not_cached_or_sniffed(api: Api) -> None:
    alice = await api.new_agent("alice")
    answers = [
        await api.http.get("/v1/memories", headers=alice.headers),
        await api.http.get("/v1/memories/not-a-uuid", headers=alice.headers),
        await api.http.get("/v1/memories"),  # 401
        await api.http.get("/v1/nothing"),  # 404
    ]
    assert [a.status_code for a in answers] == [200, 400, 401, 404]
    for answer in answers:
        assert answer.headers["cache-control"] == "no-store", answer.request.url
        assert answer.headers["x-content-type-options"] == "nosniff"


async def test_metrics_are_not_on_the_public_listener(
    api: Api, span_exporter: InMemorySpanExporter
) -> None:
    alice = await api.new_agent("alice")
    assert (await api.http.get("/v1/memories", headers=alice.headers)).status_code == 200
    for headers in ({}, alice.headers, api.admin.headers):
        public = await api.http.get("/metrics", headers=headers)
        assert public.status_code == 404
        assert public.headers["content-type"] == "application/problem+json"
        assert "http_server_request_duration" not in public.text
    async with AsyncTestClient(app=create_metrics_app()) as scraper:
        scraped = await scraper.get("/metrics")
        assert scraped.status_code == 200
        assert "http_server_request_duration_seconds" in scraped.text
        # The metrics listener serves nothing else.
        other = await scraper.get("/v1/memories", headers=alice.headers)
        assert other.status_code == 404
        assert other.headers["content-type"] == "application/problem+json"


async def test_readyz_is_terse_and_logs_the_reason(
    http: TestClient, owner_engine: AsyncEngine
) -> None:
    ready = await http.get("/readyz")
    assert (ready.status_code, ready.json()) == (200, {"status": "ok"})
    async with owner_engine.begin() as conn:
        await conn.execute(text("UPDATE alembic_version SET version_num = 'older'"))
    with structlog.testing.capture_logs() as events:
        response = await http.get("/readyz")
    assert response.status_code == 503
    assert response.json() == {"status": "not ready"}
    assert [e["reason"] for e in events if e.get("event") == "not_ready"] == [
        "migrations not at head"
    ]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
async def served_metrics() -> AsyncIterator[str]:
    """The metrics app behind a real uvicorn on loopback, configured as `memgate serve` does."""
    import uvicorn

    port = _free_port()
    server = uvicorn.Server(listener_config(create_metrics_app(), "127.0.0.1", port))
    serving = asyncio.create_task(server.serve())
    for _ in range(200):  # at most 10 s
        if server.started or serving.done():
            break
        await asyncio.sleep(0.05)
    assert server.started
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    await asyncio.wait_for(serving, 10)


async def test_the_server_does_not_name_its_software(served_metrics: str) -> None:
    async with httpx.AsyncClient(base_url=served_metrics, timeout=5) as client:
        response = await client.get("/metrics")
    assert response.status_code == 200
    assert "server" not in response.headers
    assert response.headers["x-content-type-options"] == "nosniff"
