"""The spec is public (it describes the API, nothing more); no HTML doc UIs with CDN scripts."""

from __future__ import annotations

import pytest

from tests.fixtures.api import TestClient


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
