"""Red-team F1 (admin side): NUL characters are refused as 422 problems, not driver 500s."""

from __future__ import annotations

from typing import Any

import pytest

from tests.fixtures.api import Api


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/principals", {"display_name": "a\u0000b"}, "display_name"),
        (
            "/v1/principals",
            {"display_name": "x", "external_issuer": "https://i", "external_subject": "a\u0000"},
            "external_subject",
        ),
        ("/v1/clients", {"name": "a\u0000", "kind": "agent", "scopes": ["read:memory"]}, "name"),
    ],
    ids=["principal-name", "external-subject", "client-name"],
)
async def test_nul_in_admin_bodies_is_a_422(
    api: Api, path: str, body: dict[str, Any], field: str
) -> None:
    if path == "/v1/clients":
        body = body | {"principal_id": api.admin.principal_id}
    before = (await api.http.get(path, headers=api.admin.headers)).json()["items"]
    response = await api.http.post(path, json=body, headers=api.admin.headers)
    assert response.status_code == 422, response.text
    problem = response.json()
    assert problem["type"].endswith("/invalid-request")
    assert field in {error["field"] for error in problem["errors"]}
    after = (await api.http.get(path, headers=api.admin.headers)).json()["items"]
    assert after == before
