"""The app behind a real uvicorn on loopback, and the official MCP client talking to it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult

from service.app import create_app
from service.http.server import listener_config
from service.runtime import Runtime


@asynccontextmanager
async def serving(runtime: Runtime) -> AsyncIterator[str]:
    """The app as `memgate serve` runs it, on a free loopback port; yields its base URL."""
    import uvicorn

    served = uvicorn.Server(listener_config(create_app(runtime), "127.0.0.1", 0))
    task = asyncio.create_task(served.serve())
    for _ in range(200):  # bounded: 10 s
        if served.started or task.done():
            break
        await asyncio.sleep(0.05)
    assert served.started, "uvicorn did not start"
    port = int(served.servers[0].sockets[0].getsockname()[1])
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        served.should_exit = True
        await asyncio.wait_for(task, 10)


@asynccontextmanager
async def mcp_session(base_url: str, token: str) -> AsyncIterator[ClientSession]:
    """An initialized MCP client session with `token` as its bearer token."""
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as http,
        streamable_http_client(f"{base_url}/mcp", http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def payload(result: CallToolResult) -> dict[str, Any]:
    """The JSON a tool answered with, as text (what a model reads), checked against the
    structured copy."""
    [content] = result.content
    assert content.type == "text"
    parsed: dict[str, Any] = json.loads(content.text) if not result.is_error else {}
    if not result.is_error:
        assert parsed == result.structured_content
    return parsed


def error_text(result: CallToolResult) -> str:
    assert result.is_error, result
    [content] = result.content
    assert content.type == "text"
    return content.text
