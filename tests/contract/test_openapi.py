"""openapi.yaml is generated from the app and committed; any drift fails here."""

from __future__ import annotations

from pathlib import Path

import yaml

from service.http.openapi_doc import render_openapi
from service.problems import PROBLEM_TYPES

ROOT = Path(__file__).resolve().parents[2]


def test_committed_openapi_matches_the_app() -> None:
    committed = (ROOT / "openapi.yaml").read_text()
    assert committed == render_openapi(), "openapi.yaml drifted: run `memgate openapi`"


def test_every_problem_type_is_listed() -> None:
    document = yaml.safe_load((ROOT / "openapi.yaml").read_text())
    listed = {entry["type"] for entry in document["x-problem-types"]}
    assert listed == {cls.type_uri() for cls in PROBLEM_TYPES.values()}
    assert all(entry["description"] for entry in document["x-problem-types"])


def test_every_route_but_the_public_ones_requires_a_bearer_token() -> None:
    document = yaml.safe_load((ROOT / "openapi.yaml").read_text())
    assert document["security"] == [{"bearer": []}]
    assert set(document["paths"]) >= {
        "/v1/memories",
        "/v1/memories/search",
        "/v1/memories/{memory_id}",
        "/oauth/token",
        "/.well-known/jwks.json",
    }
