"""Shared fixtures: one PostgreSQL server per run, a migrated template database, and a fresh
database cloned from it for every test (isolation without re-running migrations)."""

from __future__ import annotations

import base64
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest
from litestar.testing import AsyncTestClient
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy.ext.asyncio import AsyncEngine

from service.app import create_app
from service.db.migrate import upgrade
from service.db.session import create_engine
from service.embeddings import Embedder
from service.embeddings.wordllama import WordLlamaEmbedder
from service.observability.telemetry import configure_telemetry
from service.operations import UNDECLARED, check_answers
from service.runtime import Runtime, build_runtime
from service.settings import (
    AuthSettings,
    DatabaseSettings,
    ExternalIssuer,
    JobSettings,
    ObservabilitySettings,
    ServerSettings,
    Settings,
)
from tests.fixtures import entrance
from tests.fixtures.api import Api, TestClient
from tests.fixtures.postgres import app_login, postgres_server, with_database

pytest_plugins = ["tests.integration.auth.external_idp"]
"""Fixtures shared across feature folders (a fake external IdP), registered once here rather
than imported into each test module that uses them."""

TEMPLATE_DB = "memgate_test_template"
PUBLIC_URL = "http://localhost:8080"
TRUSTED_TEST_ISSUER = "https://idp.example"
"""The one external issuer the default test deployment trusts, so that principals can be mapped
to it (memgate refuses mappings to an issuer it does not trust). No test presents its tokens:
its key set address is a closed loopback port that is never fetched."""

# Promise 2 in SQL: from here on every statement this process sends is checked for a read of
# the memory table that did not come from Visible (tests/fixtures/entrance.py).
entrance.install()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "bypasses_visible(reason): the test reads the memory table without Visible on purpose",
    )


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """List the named bypasses of Visible this run used (in this process), so they stay few."""
    for reason in sorted(entrance.CHECK.reasons_used):
        terminalreporter.write_line(f"Visible bypassed on purpose: {reason}")


@pytest.fixture(autouse=True)
def visible_is_the_only_entrance(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail the test if any statement it caused read memory rows without Visible, even where
    the app turned the error into a 500; a `bypasses_visible` mark names the exception."""
    entrance.CHECK.violations.clear()
    marker = request.node.get_closest_marker("bypasses_visible")
    if marker is None:
        yield
    else:
        with entrance.bypasses_visible(*marker.args):
            yield
    found, entrance.CHECK.violations[:] = list(entrance.CHECK.violations), []
    if found:
        pytest.fail(str(found[0]), pytrace=False)


# Before any app is built: every app of the suite checks that each problem it answers is one
# its operation declares (service/http/answers.py); `every_answer_is_declared` fails the test.
check_answers()


@pytest.fixture(autouse=True)
def every_answer_is_declared() -> Iterator[None]:
    """A test that made an operation answer a problem it does not declare fails, naming both:
    the declarations (`service/<feature>/operations.py`) are what openapi.yaml promises."""
    UNDECLARED.clear()
    yield
    found = list(dict.fromkeys(UNDECLARED))
    UNDECLARED.clear()
    if found:
        pytest.fail(
            "undeclared problem answered (declare it in service/<feature>/operations.py): "
            + "; ".join(found),
            pytrace=False,
        )


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    with postgres_server() as url:
        yield url


@pytest.fixture(scope="session")
def template_db(pg_server: str) -> str:
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE_DB}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{TEMPLATE_DB}"')
    url = with_database(pg_server, TEMPLATE_DB)
    with entrance.bypasses_visible("migrations define the memory table"):
        upgrade(url)
    return url


@pytest.fixture
def database_url(pg_server: str, template_db: str) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{TEMPLATE_DB}"')
    yield with_database(pg_server, name)
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def span_exporter() -> InMemorySpanExporter:
    """Every span finished from now on, in memory; also turns on the Prometheus registry.

    OpenTelemetry's providers are process-wide and set once, so this fixture is the only place
    tests configure them (the assert fails if anything configured them first). Tests that read
    spans clear() the exporter before acting."""
    exporter = InMemorySpanExporter()
    assert configure_telemetry(
        ObservabilitySettings(), span_processors=[SimpleSpanProcessor(exporter)]
    ), "telemetry was configured before the span_exporter fixture"
    return exporter


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    return WordLlamaEmbedder()


def make_settings(database_url: str, data_dir: Path, **auth: Any) -> Settings:
    return Settings(
        database=DatabaseSettings(url=database_url, data_dir=data_dir, pool_size=5),
        server=ServerSettings(public_url=PUBLIC_URL),
        # No in-process job worker: a test runs the jobs it means to (tests/integration/jobs),
        # so no run queued by another test's setup adds audit rows behind its back.
        jobs=JobSettings(poll_seconds=0),
        auth=replace(
            AuthSettings(
                key_encryption_key=base64.urlsafe_b64encode(os.urandom(32)).decode(),
                external_issuers=(
                    ExternalIssuer(
                        issuer=TRUSTED_TEST_ISSUER,
                        audience="memgate",
                        jwks_url="http://127.0.0.1:9/jwks",
                    ),
                ),
            ),
            **auth,
        ),
    )


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    return make_settings(database_url, tmp_path)


@pytest.fixture
async def runtime(settings: Settings, embedder: Embedder) -> AsyncIterator[Runtime]:
    built = await build_runtime(
        settings, app_login(settings.database.url), embedder, owner_url=settings.database.url
    )
    yield built
    await built.close()


@pytest.fixture
async def owner_engine(settings: Settings) -> AsyncIterator[AsyncEngine]:
    """The database as its owner (a superuser here), for what the app role may not do: moving
    the migration head, tampering with the audit log."""
    engine = create_engine(settings.database.url, pool_size=1)
    yield engine
    await engine.dispose()


@pytest.fixture
async def http(runtime: Runtime) -> AsyncIterator[TestClient]:
    async with AsyncTestClient(app=create_app(runtime), base_url=PUBLIC_URL) as client:
        yield client


@pytest.fixture
async def api(http: TestClient, runtime: Runtime) -> Api:
    return await Api.bootstrap(http, runtime)
