"""One database, runtime, app and seeded pair of tenants per test module: the probes only read
(or are refused), so they share them and the module stays fast. Each probe checks that it
changed nothing, which is also what makes the sharing sound."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from litestar.testing import AsyncTestClient
from sqlalchemy.ext.asyncio import AsyncEngine

from service.app import create_app
from service.db.session import create_engine
from service.embeddings import Embedder
from service.runtime import Runtime, build_runtime
from tests.conftest import PUBLIC_URL, cloned_database, make_settings
from tests.fixtures.api import Api, TestClient
from tests.fixtures.postgres import app_login
from tests.integration.tenants.world import World, seed_world


@pytest.fixture(scope="module")
def module_database_url(pg_server: str, template_db: str) -> Iterator[str]:
    with cloned_database(pg_server, prefix="m") as url:
        yield url


@pytest.fixture(scope="module")
async def module_runtime(
    module_database_url: str, tmp_path_factory: pytest.TempPathFactory, embedder: Embedder
) -> AsyncIterator[Runtime]:
    settings = make_settings(module_database_url, Path(tmp_path_factory.mktemp("tenants")))
    built = await build_runtime(
        settings, app_login(module_database_url), embedder, owner_url=module_database_url
    )
    yield built
    await built.close()


@pytest.fixture(scope="module")
async def module_http(module_runtime: Runtime) -> AsyncIterator[TestClient]:
    async with AsyncTestClient(app=create_app(module_runtime), base_url=PUBLIC_URL) as client:
        yield client


@pytest.fixture(scope="module")
async def oracle(module_database_url: str) -> AsyncIterator[AsyncEngine]:
    """The database as its owner, past row-level security: what is really stored."""
    engine = create_engine(module_database_url, pool_size=1)
    yield engine
    await engine.dispose()


@pytest.fixture(scope="module")
async def world(module_http: TestClient, module_runtime: Runtime) -> World:
    return await seed_world(await Api.bootstrap(module_http, module_runtime))
