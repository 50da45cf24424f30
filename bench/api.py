"""End-to-end latency of the API in process: token verification, principal lookup, embedding,
SQL and JSON, for a write and a search, one request at a time.

    .venv/bin/python -m bench.api [--memories 2000] [--requests 300]

Starts its own embedded PostgreSQL (or uses DATABASE_URL), builds the real app, and talks to it
through an ASGI transport (no sockets, so what is measured is memgate, not the network). Prints
medians and p95 per operation. Later work (audit, policy) reports its overhead against these.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, cast

import httpx
from memgate_client import AsyncMemgate, ClientCredentials

from bench.database import bench_database
from service.app import create_app
from service.embeddings.wordllama import WordLlamaEmbedder
from service.identity.service import create_tenant
from service.runtime import Runtime, build_runtime
from service.settings import AuthSettings, DatabaseSettings, ServerSettings, Settings

PUBLIC_URL = "http://localhost:8080"
FORM = {"grant_type": "client_credentials"}
TOPICS = ("deploy", "billing", "oncall", "database", "release", "incident", "customer", "api")


def _settings(url: str, data_dir: Path) -> Settings:
    return Settings(
        database=DatabaseSettings(url=url, data_dir=data_dir),
        server=ServerSettings(public_url=PUBLIC_URL),
        auth=AuthSettings(key_encryption_key=base64.urlsafe_b64encode(os.urandom(32)).decode()),
    )


def report(name: str, samples: list[float]) -> None:
    p50 = statistics.median(samples)
    p95 = statistics.quantiles(samples, n=20)[18]
    print(f"{name:<28} p50 {p50:7.2f} ms  p95 {p95:7.2f} ms  (n={len(samples)})")


async def _timed(call: Callable[[int], Awaitable[httpx.Response]], count: int) -> list[float]:
    samples: list[float] = []
    for i in range(count):
        started = time.perf_counter()
        response = await call(i)
        samples.append((time.perf_counter() - started) * 1000)
        assert response.status_code < 300, response.text
    return samples


async def new_runtime(url: str) -> Runtime:
    return await build_runtime(
        _settings(url, Path(tempfile.mkdtemp())), url, WordLlamaEmbedder(), owner_url=url
    )


_PLATFORM_ADMINS: dict[int, tuple[str, str]] = {}
"""The platform admin's client of each runtime (its database), bootstrapped on first use."""


async def _new_tenant_admin(client: httpx.AsyncClient, runtime: Runtime) -> tuple[str, str]:
    """A fresh tenant made as an operator would (`POST /v1/tenants` as the platform admin):
    its admin client's id and secret."""
    if id(runtime) not in _PLATFORM_ADMINS:
        async with runtime.sessionmaker.begin() as session:
            platform = await create_tenant(session, "platform", platform=True)
        _PLATFORM_ADMINS[id(runtime)] = (str(platform.client_id), platform.client_secret)
    operator = ClientCredentials(*_PLATFORM_ADMINS[id(runtime)])
    async with AsyncMemgate(PUBLIC_URL, credentials=operator, http=client) as mg:
        admin = (await mg.create_tenant(name="bench"))["admin"]
    return admin["client_id"], admin["client_secret"]


async def agent_credentials(client: httpx.AsyncClient, runtime: Runtime) -> tuple[str, str]:
    """A fresh tenant and an agent client with read and write scopes in it (set up through
    the typed client, over `client`'s transport)."""
    admin = ClientCredentials(*await _new_tenant_admin(client, runtime))
    async with AsyncMemgate(PUBLIC_URL, credentials=admin, http=client) as mg:
        user = await mg.create_principal(display_name="u")
        registered = await mg.create_client(
            principal_id=user["id"], name="agent", scopes=["read:memory", "write:memory"]
        )
    return registered["client"]["client_id"], registered["client_secret"]


async def bearer(client: httpx.AsyncClient, credentials: tuple[str, str]) -> dict[str, str]:
    token = (await client.post("/oauth/token", data=FORM, auth=credentials)).json()
    return {"Authorization": f"Bearer {token['access_token']}"}


def write_body(i: int) -> dict[str, Any]:
    topic = TOPICS[i % len(TOPICS)]
    return {
        # One subject per note: distinct facts, so the write gate (keys of one subject) lets
        # each through, and the body stays one that older checkouts accept.
        "subject": f"service:{topic}.{i}",
        "kind": "fact",
        "key": f"{topic}.note.{i}",
        "value": f"Note {i} about the {topic} process and who owns it",
    }


def search_body(i: int) -> dict[str, Any]:
    return {"query": f"who owns the {TOPICS[i % len(TOPICS)]} process", "k": 10}


async def run(url: str, memories: int, requests: int) -> None:
    runtime = await new_runtime(url)
    app = create_app(runtime)
    transport = httpx.ASGITransport(app=cast(Any, app))
    async with httpx.AsyncClient(transport=transport, base_url=PUBLIC_URL) as client:
        agent_auth = await agent_credentials(client, runtime)
        agent = await bearer(client, agent_auth)
        form = FORM

        async def write(i: int) -> httpx.Response:
            return await client.post("/v1/memories", json=write_body(i), headers=agent)

        async def search(i: int) -> httpx.Response:
            return await client.post("/v1/memories/search", json=search_body(i), headers=agent)

        async def get_token(_: int) -> httpx.Response:
            return await client.post("/oauth/token", data=form, auth=agent_auth)

        await _timed(write, memories)  # fill the agent's space
        report("write (new key)", await _timed(lambda i: write(memories + i), requests))
        report(f"search k=10 over {memories + requests}", await _timed(search, requests))
        report("token (client credentials)", await _timed(get_token, min(requests, 50)))
    await runtime.close()


def bench_main(
    run: Callable[[str, int, int], Coroutine[Any, Any, None]], description: str | None
) -> None:
    """`--memories N --requests M` against a scratch database (embedded or DATABASE_URL)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--memories", type=int, default=2000)
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    with bench_database() as url:
        asyncio.run(run(url, args.memories, args.requests))


def main() -> None:
    bench_main(run, __doc__)


if __name__ == "__main__":
    main()
