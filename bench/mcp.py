"""What MCP costs over REST: the same write, search and get, one at a time, through `/v1` and
through `/mcp` tools (the official client, one initialized session), over real HTTP.

    .venv/bin/python -m bench.mcp [--memories 500] [--requests 100]

Starts its own embedded PostgreSQL (or uses DATABASE_URL), serves the real app with uvicorn on
a loopback port, and prints medians and p95 per operation with the MCP/REST ratio. Both sides
do the same work (token check, principal lookup, embedding, SQL, audit row, commit); the
difference is the JSON-RPC envelope and the SDK's per-request transport.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

import httpx
import httpx2
import uvicorn
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from bench.api import agent_credentials, bearer, new_runtime, search_body, write_body
from bench.database import bench_database
from service.app import create_app


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def _timed(call: Callable[[int], Awaitable[None]], count: int) -> list[float]:
    samples: list[float] = []
    for i in range(count):
        started = time.perf_counter()
        await call(i)
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def _line(name: str, rest: list[float], mcp: list[float]) -> str:
    def p95(samples: list[float]) -> float:
        return statistics.quantiles(samples, n=20)[18]

    r50, m50 = statistics.median(rest), statistics.median(mcp)
    return (
        f"{name:<8} REST p50 {r50:6.2f} ms p95 {p95(rest):6.2f} ms | "
        f"MCP p50 {m50:6.2f} ms p95 {p95(mcp):6.2f} ms | MCP/REST {m50 / r50:4.2f}x"
    )


async def _compare(
    base: str, http: httpx.AsyncClient, headers: dict[str, str], memories: int, requests: int
) -> None:
    ids = [
        (await http.post("/v1/memories", json=write_body(i), headers=headers)).json()["memory"][
            "id"
        ]
        for i in range(memories)
    ]

    async def ok(response: Awaitable[httpx.Response]) -> None:
        answered = await response
        assert answered.status_code < 300, answered.text

    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as mcp_http,
        streamable_http_client(f"{base}/mcp", http_client=mcp_http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()

        async def tool(name: str, arguments: dict[str, Any]) -> None:
            result = await session.call_tool(name, arguments)
            assert not result.is_error, result

        offset = memories
        cases: list[
            tuple[str, Callable[[int], Awaitable[None]], Callable[[int], Awaitable[None]]]
        ] = [
            (
                "write",
                lambda i: ok(
                    http.post("/v1/memories", json=write_body(offset + i), headers=headers)
                ),
                lambda i: tool("remember", write_body(offset + requests + i)),
            ),
            (
                "search",
                lambda i: ok(
                    http.post("/v1/memories/search", json=search_body(i), headers=headers)
                ),
                lambda i: tool("recall", search_body(i)),
            ),
            (
                "get",
                lambda i: ok(http.get(f"/v1/memories/{ids[i % len(ids)]}", headers=headers)),
                lambda i: tool("get_memory", {"id": ids[i % len(ids)]}),
            ),
        ]
        for name, rest_call, mcp_call in cases:
            await _timed(rest_call, 5)  # warm both paths
            await _timed(mcp_call, 5)
            rest = await _timed(rest_call, requests)
            mcp = await _timed(mcp_call, requests)
            print(_line(name, rest, mcp))


async def run(url: str, memories: int, requests: int) -> None:
    runtime = await new_runtime(url)
    port = _free_port()
    config = uvicorn.Config(
        cast(Any, create_app(runtime)), host="127.0.0.1", port=port, log_level="error"
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    for _ in range(200):  # bounded: 10 s
        if server.started:
            break
        await asyncio.sleep(0.05)
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            headers = await bearer(http, await agent_credentials(http, runtime))
            print(f"{memories} memories, {requests} sequential requests per operation and side")
            await _compare(base, http, headers, memories, requests)
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 10)
        await runtime.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--memories", type=int, default=500)
    parser.add_argument("--requests", type=int, default=100)
    args = parser.parse_args()
    with bench_database() as url:
        asyncio.run(run(url, args.memories, args.requests))


if __name__ == "__main__":
    main()
