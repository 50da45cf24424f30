"""The spec is public (it describes the API, nothing more); no HTML doc UIs with CDN scripts;
an operator may turn it off."""

from __future__ import annotations

from dataclasses import replace

import pytest
from litestar.testing import AsyncTestClient

from service.app import create_app
from service.embeddings import Embedder
from service.runtime import build_runtime
from service.settings import Settings
from tests.conftest import PUBLIC_URL
from tests.fixtures.api import TestClient
from tests.fixtures.postgres import app_login


async def test_the_spec_is_served_without_a_token(http: TestClient) -> None:
    for path in ("/schema/openapi.json", "/schema/openapi.yaml"):
        response = await http.get(path)
        assert response.status_code == 200, path
        assert "memgate" in response.text


@pytest.mark.parametrize(
    "path", ["/schema/swagger", "/schema/redoc", "/schema/elements", "/schema/rapidoc"]
)
async def test_no_html_doc_ui_is_served(http: TestClient, path: str) -> None:
    response = await http.get(path)
    assert response.status_code == 404
    assert "cdn." not in response.text
    assert "<script" not in response.text


async def test_the_schema_root_is_the_spec_not_a_page(http: TestClient) -> None:
    response = await http.get("/schema")
    assert response.headers["content-type"].startswith("application/vnd.oai.openapi+json")


async def test_with_schema_docs_off_no_schema_route_is_served(
    settings: Settings, embedder: Embedder
) -> None:
    """Issue 18, misconfiguration: MEMGATE_SCHEMA_DOCS=0 (the Helm chart's default) serves no
    /schema route; the API itself is unchanged."""
    off = replace(settings, server=replace(settings.server, schema_docs=False))
    runtime = await build_runtime(
        off, app_login(off.database.url), embedder, owner_url=off.database.url
    )
    try:
        async with AsyncTestClient(app=create_app(runtime), base_url=PUBLIC_URL) as http:
            for path in ("/schema", "/schema/openapi.json", "/schema/openapi.yaml"):
                response = await http.get(path)
                assert response.status_code == 404, path
                assert response.headers["content-type"].startswith("application/problem+json")
                assert "openapi" not in response.text.lower().replace(path.lower(), "")
            assert (await http.get("/healthz")).status_code == 200
            assert (await http.get("/v1/memories")).status_code == 401
    finally:
        await runtime.close()
