"""A grant put back by hand (or a database not migrated this far) voids a protection of the app
role: the start-up login check names it and `/readyz` fails, without telling bystanders why."""

from __future__ import annotations

import pytest
from litestar.testing import AsyncTestClient
from sqlalchemy.ext.asyncio import AsyncEngine

from service.app import create_app
from service.db.roles import app_login_url
from service.embeddings import Embedder
from service.runtime import build_runtime
from service.settings import Settings
from tests.conftest import PUBLIC_URL
from tests.fixtures.postgres import app_login
from tests.integration.audit.support import owner_execute


@pytest.mark.parametrize(
    ("grant", "problem"),
    [
        (
            "GRANT INSERT ON signing_keys TO memgate_app",
            "the app role may write token signing keys",
        ),
        (
            "GRANT INSERT ON audit_signing_keys TO memgate_app",
            "the app role may write audit signing keys",
        ),
        (
            "GRANT INSERT ON audit_checkpoints TO memgate_app",
            "the app role may insert checkpoints directly",
        ),
    ],
)
async def test_a_grant_given_back_is_reported_and_readyz_fails(
    settings: Settings, embedder: Embedder, owner_engine: AsyncEngine, grant: str, problem: str
) -> None:
    await owner_execute(owner_engine, grant)
    runtime = await build_runtime(
        settings, app_login(settings.database.url), embedder, owner_url=settings.database.url
    )
    try:
        assert runtime.login_problems == [problem]
        async with AsyncTestClient(app=create_app(runtime), base_url=PUBLIC_URL) as http:
            ready = await http.get("/readyz")
        assert ready.status_code == 503
        assert ready.json() == {"status": "not ready"}  # the reason is logged, not told
    finally:
        await runtime.close()


async def test_a_login_that_bypasses_row_level_security_is_reported_and_readyz_fails(
    settings: Settings, embedder: Embedder, owner_engine: AsyncEngine
) -> None:
    """Issue 18, misconfiguration: a login with BYPASSRLS (not a superuser) would read every
    tenant's rows. Its own login (roles are the cluster's, shared with the other tests)."""
    await owner_execute(
        owner_engine,
        "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'memgate_bypassing') "
        "THEN CREATE ROLE memgate_bypassing LOGIN NOSUPERUSER BYPASSRLS IN ROLE memgate_app; "
        "END IF; END $$",
    )
    login = app_login_url(settings.database.url, "memgate_bypassing")
    runtime = await build_runtime(settings, login, embedder, owner_url=settings.database.url)
    try:
        assert runtime.login_problems == ["the database login bypasses row-level security"]
        async with AsyncTestClient(app=create_app(runtime), base_url=PUBLIC_URL) as http:
            ready = await http.get("/readyz")
        assert ready.status_code == 503
        assert ready.json() == {"status": "not ready"}
    finally:
        await runtime.close()
