"""Shared fixtures: one PostgreSQL server per run, a migrated template database, and a fresh
database cloned from it for every test (isolation without re-running migrations)."""

from __future__ import annotations

import base64
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
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
from service.identity.service import BootstrapResult
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
from tests.fixtures.api import Agent, Api, TestClient
from tests.fixtures.postgres import app_login, postgres_server, with_database

RAM_DISK = Path("/dev/shm")  # noqa: S108 (a test run's own files, in folders mkdtemp makes)
RAM_DISK_FREE_BYTES = 4 << 30
"""What a run may need there at once (each worker's cluster, the clusters CLI tests start, a
base backup): a container's 64 MiB /dev/shm is left alone."""


def _roomy_ram_disk() -> bool:
    if not (RAM_DISK.is_dir() and os.access(RAM_DISK, os.W_OK)):
        return False
    return shutil.disk_usage(RAM_DISK).free >= RAM_DISK_FREE_BYTES


if "TMPDIR" not in os.environ and _roomy_ram_disk():
    # Every temporary file of the run on a RAM disk where there is a roomy one: the suite's
    # PostgreSQL cluster, the clusters CLI tests start, tmp_path. Cloning a test database writes
    # a few hundred files; on this box's ext4 a clone took ~370 ms, on tmpfs ~20 ms. What the
    # tests observe is the same; subprocesses inherit TMPDIR, a runner's own TMPDIR wins.
    os.environ["TMPDIR"] = str(RAM_DISK)
    tempfile.tempdir = None  # gettempdir() looks again


pytest_plugins = ["tests.integration.auth.external_idp"]
"""Fixtures shared across feature folders (a fake external IdP), registered once here rather
than imported into each test module that uses them."""

TEMPLATE_DB = "memgate_test_template"
ACME_TEMPLATE_DB = "memgate_test_template_acme"
"""The migrated template plus what the `api` fixture makes in every test (the platform tenant,
the tenant `acme` made through `POST /v1/tenants`, both admins' tokens), made once per run:
tests that ask for `api` start from a clone of it instead of paying those argon2 hashes and
calls again."""
SESSION_KEK = base64.urlsafe_b64encode(os.urandom(32)).decode()
"""One key-encryption key per run, so the signing keys sealed in the baked template open in
every test's runtime."""
BAKED_TOKEN_TTL_SECONDS = 3600
"""The baked admins' tokens live as long as memgate allows, longer than a run; an older one is
minted again (`baked_api`)."""
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


@dataclass(frozen=True)
class BakedTenants:
    """What the acme template holds, with the secrets and tokens only its maker saw."""

    platform: BootstrapResult
    platform_token: str
    acme_tenant_id: str
    acme_admin: Agent
    minted_at: float


@pytest.fixture(scope="session")
async def acme_template(
    pg_server: str, template_db: str, embedder: Embedder, tmp_path_factory: pytest.TempPathFactory
) -> BakedTenants:
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{ACME_TEMPLATE_DB}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{ACME_TEMPLATE_DB}" TEMPLATE "{TEMPLATE_DB}"')
    url = with_database(pg_server, ACME_TEMPLATE_DB)
    settings = make_settings(
        url, tmp_path_factory.mktemp("acme"), token_ttl_seconds=BAKED_TOKEN_TTL_SECONDS
    )
    minted_at = time.monotonic()
    runtime = await build_runtime(settings, app_login(url), embedder, owner_url=url)
    try:
        async with AsyncTestClient(app=create_app(runtime), base_url=PUBLIC_URL) as client:
            acme = await Api.bootstrap(client, runtime)
            platform = await Api.platform(client, runtime)
    finally:
        await runtime.close()
    return BakedTenants(
        platform=BootstrapResult(
            tenant_id=uuid.UUID(platform.tenant_id),
            admin_principal_id=uuid.UUID(platform.admin.principal_id),
            client_id=uuid.UUID(platform.admin.client_id),
            client_secret=platform.admin.secret,
        ),
        platform_token=platform.admin.token,
        acme_tenant_id=acme.tenant_id,
        acme_admin=acme.admin,
        minted_at=minted_at,
    )


@contextmanager
def cloned_database(
    pg_server: str, template: str = TEMPLATE_DB, prefix: str = "t"
) -> Iterator[str]:
    """A fresh database cloned from `template`, dropped afterwards."""
    name = f"{prefix}_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    try:
        yield with_database(pg_server, name)
    finally:
        with psycopg.connect(pg_server, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def database_url(request: pytest.FixtureRequest, pg_server: str, template_db: str) -> Iterator[str]:
    """A fresh database: a clone of the acme template for a test that asks for `api`, else of
    the bare migrated template."""
    template = TEMPLATE_DB
    if "api" in request.fixturenames:
        request.getfixturevalue("acme_template")
        template = ACME_TEMPLATE_DB
    with cloned_database(pg_server, template) as url:
        yield url


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
                key_encryption_key=SESSION_KEK,
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
async def api(http: TestClient, runtime: Runtime, acme_template: BakedTenants) -> Api:
    """The tenant `acme` and its admin, as `Api.bootstrap` makes them, from the baked template."""
    baked, admin = acme_template, replace(acme_template.acme_admin)
    platform_token = baked.platform_token
    if time.monotonic() - baked.minted_at > BAKED_TOKEN_TTL_SECONDS - 600:  # a very long run
        platform = baked.platform
        platform_token = await Api.mint_token(http, str(platform.client_id), platform.client_secret)
        admin.token = await Api.mint_token(http, admin.client_id, admin.secret)
    Api.adopt_platform(runtime.settings.database.url, baked.platform, platform_token)
    return Api(http, runtime, baked.acme_tenant_id, admin)
