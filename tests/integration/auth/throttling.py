"""Helpers of the token endpoint's flood and limit tests (review item 1)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import QueuePool

from service.app import create_app
from service.runtime import Runtime
from tests.conftest import PUBLIC_URL

FORM = {"grant_type": "client_credentials"}
FLOOD_SECONDS = 60.0


@asynccontextmanager
async def concurrent_client(runtime: Runtime) -> AsyncIterator[httpx.AsyncClient]:
    """The app over httpx's ASGI transport: requests really run concurrently on the loop (the
    Litestar test client does not overlap them), from source address 127.0.0.1."""
    transport = httpx.ASGITransport(app=cast(Any, create_app(runtime)))
    async with httpx.AsyncClient(transport=transport, base_url=PUBLIC_URL) as client:
        yield client


async def wrong_secret(http: httpx.AsyncClient, client_id: str) -> httpx.Response:
    response: httpx.Response = await http.post(
        "/oauth/token", data=FORM, auth=(client_id, "mgs_wrong-secret")
    )
    return response


async def timed_reads(http: httpx.AsyncClient, headers: dict[str, str], count: int) -> list[float]:
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        response = await http.get("/v1/memories", headers=headers)
        samples.append(time.perf_counter() - started)
        assert response.status_code == 200, response.text
    return samples


async def peak_checked_out(engine: AsyncEngine, stop: asyncio.Event) -> int:
    peak = 0
    while not stop.is_set():
        peak = max(peak, cast(QueuePool, engine.pool).checkedout())
        await asyncio.sleep(0.002)
    return peak


def assert_retry_later(response: httpx.Response, status: int, slug: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    assert int(response.headers["retry-after"]) >= 1
    assert response.headers["cache-control"] == "no-store"
    body = response.json()
    assert body["type"].endswith("/" + slug)
    assert body["status"] == status
    assert body["error"] == "temporarily_unavailable"
    assert body["error_description"] == body["detail"]
    assert body["retry_after"] == int(response.headers["retry-after"])
    assert "mgs_wrong-secret" not in response.text
