"""One database, runtime and real uvicorn on loopback per test module, and the typed client
(clients/python) talking to it over TCP: the in-process test client cannot drop a connection
or let a token expire on the wire.

Tokens live `TOKEN_TTL` seconds with no leeway, so the client's refresh is exercised by every
module here, and a test can watch a token expire without a long sleep."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import pytest
from memgate_client import AsyncMemgate, ClientCredentials, RetryPolicy
from memgate_client.types import ClientCreated, PrincipalKind

from service.embeddings import Embedder
from service.identity.service import create_tenant
from service.runtime import Runtime, build_runtime
from tests.conftest import cloned_database, make_settings
from tests.fixtures.postgres import app_login
from tests.integration.mcp.support import serving

TOKEN_TTL = 3
"""Seconds: the client replaces a token 1.6 s before (credentials.refresh_margin)."""
QUICK = RetryPolicy(attempts=3, backoff=0.05)
MEMORY_SCOPES = ["read:memory", "write:memory", "delete:memory"]


@pytest.fixture(scope="module")
def module_database_url(pg_server: str, template_db: str) -> Iterator[str]:
    with cloned_database(pg_server, prefix="c") as url:
        yield url


@pytest.fixture(scope="module")
async def module_runtime(
    module_database_url: str, tmp_path_factory: pytest.TempPathFactory, embedder: Embedder
) -> AsyncIterator[Runtime]:
    settings = make_settings(
        module_database_url,
        Path(tmp_path_factory.mktemp("client")),
        token_ttl_seconds=TOKEN_TTL,
        leeway_seconds=0,
    )
    built = await build_runtime(
        settings, app_login(module_database_url), embedder, owner_url=module_database_url
    )
    yield built
    await built.close()


@pytest.fixture(scope="module")
async def base_url(module_runtime: Runtime) -> AsyncIterator[str]:
    async with serving(module_runtime) as base:
        yield base


@pytest.fixture(scope="module")
async def platform(module_runtime: Runtime) -> ClientCredentials:
    """The platform admin's credentials, made as the first start makes them."""
    async with module_runtime.sessionmaker.begin() as session:
        created = await create_tenant(session, "platform", platform=True)
    return ClientCredentials(str(created.client_id), created.client_secret)


@dataclass(frozen=True)
class Tenant:
    tenant_id: str
    admin: ClientCredentials
    base_url: str

    def client(self, credentials: ClientCredentials | None = None) -> AsyncMemgate:
        return AsyncMemgate(self.base_url, credentials=credentials or self.admin, retry=QUICK)

    async def agent(
        self, name: str, scopes: list[str] = MEMORY_SCOPES, kind: PrincipalKind = "user"
    ) -> Agent:
        """A principal and its client, registered through the client by the tenant's admin."""
        async with self.client() as admin:
            principal = await admin.create_principal(display_name=name, kind=kind)
            created = await admin.create_client(
                principal_id=principal["id"], name=name, scopes=scopes
            )
        return Agent(principal["id"], created)


@dataclass(frozen=True)
class Agent:
    principal_id: str
    created: ClientCreated

    def credentials(self, scope: list[str] | None = None) -> ClientCredentials:
        client = self.created["client"]
        return ClientCredentials(client["client_id"], self.created["client_secret"], scope)


async def new_tenant(base_url: str, platform: ClientCredentials, name: str) -> Tenant:
    async with AsyncMemgate(base_url, credentials=platform, retry=QUICK) as mg:
        created = await mg.create_tenant(name=name)
    admin = created["admin"]
    credentials = ClientCredentials(admin["client_id"], admin["client_secret"])
    return Tenant(created["tenant"]["tenant_id"], credentials, base_url)


@pytest.fixture(scope="module")
async def tenant(base_url: str, platform: ClientCredentials) -> Tenant:
    return await new_tenant(base_url, platform, "acme")


class DroppingProxy:
    """A loopback TCP proxy to the server that drops the next `drops` requests: `before`
    forwarding them (the server never sees them) or `after` the server answered (the answer is
    lost on the way back). Every connection is its own upstream connection."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.drops = 0
        self.when = "before"
        self.dropped = 0
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def drop(self, drops: int, when: str) -> None:
        self.drops, self.when, self.dropped = drops, when, 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", 0)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        swallow, answered = asyncio.Event(), asyncio.Event()

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            while data := await source.read(65536):
                if sink is writer and swallow.is_set():
                    answered.set()  # the server answered: lose it
                    return
                sink.write(data)
                await sink.drain()

        down = asyncio.create_task(pipe(up_reader, writer))
        up: asyncio.Task[None] | None = None
        try:
            chunk = await reader.read(65536)
            while chunk:
                if self.drops > 0:
                    self.drops -= 1
                    self.dropped += 1
                    if self.when == "after":
                        swallow.set()
                        up_writer.write(chunk)
                        await up_writer.drain()
                        up = asyncio.create_task(pipe(reader, up_writer))  # the rest of it
                        await asyncio.wait_for(answered.wait(), 30)
                    return
                up_writer.write(chunk)
                await up_writer.drain()
                chunk = await reader.read(65536)
        finally:
            for task in (down, up):
                if task is not None:
                    task.cancel()
            for stream in (writer, up_writer):
                stream.close()
                with suppress(ConnectionError):
                    await stream.wait_closed()


@pytest.fixture(scope="module")
async def proxy(base_url: str) -> AsyncIterator[DroppingProxy]:
    started = DroppingProxy(int(base_url.rsplit(":", 1)[1]))
    await started.start()
    yield started
    await started.close()
