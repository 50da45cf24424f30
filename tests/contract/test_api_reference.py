"""docs/api.md is generated from openapi.yaml and committed; any drift fails here (regenerate
both with `memgate openapi --markdown docs/api.md`). And it tells the truth: every documented
operation has its section, with the scope its declaration names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

import service.app  # noqa: F401  (importing the app declares every feature's operations)
from service.http.openapi_doc import API_REFERENCE, api_reference
from service.operations import OPERATIONS

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "openapi.yaml").read_text())
    return loaded


def test_committed_api_reference_matches_openapi_yaml(document: dict[str, Any]) -> None:
    committed = (ROOT / API_REFERENCE).read_text()
    assert committed == api_reference(document), (
        "docs/api.md drifted: run `memgate openapi --markdown docs/api.md`"
    )


def test_every_operation_has_a_section_with_its_scope(document: dict[str, Any]) -> None:
    rendered = api_reference(document)
    declared = {op.operation_id: op for op in OPERATIONS.values()}
    sections = rendered.split("\n### ")[1:]
    by_id = {section.split("`")[1]: section for section in sections}
    documented = {
        operation["operationId"]
        for item in document["paths"].values()
        for operation in item.values()
        if isinstance(operation, dict) and "operationId" in operation
    }
    assert set(by_id) == documented
    for operation_id, section in by_id.items():
        op = declared.get(operation_id)
        if op is not None and op.scope is not None:
            assert f"- scope: `{op.scope}`" in section, operation_id
        if op is not None and op.public:
            assert "- scope: none (public: no token)" in section, operation_id
    assert "`POST /v1/memories` — Write a memory" in by_id["writeMemory"]
    assert "409 [`key-choice-required`]" in by_id["writeMemory"]
    assert "request: `MemoryCreate` (application/json)" in by_id["writeMemory"]
    assert "answer: 201 `MemoryWritten` (application/json)" in by_id["writeMemory"]
    assert "`TokenRequest` (application/x-www-form-urlencoded)" in by_id["issueToken"]


def test_every_problem_linked_is_in_the_catalogue(document: dict[str, Any]) -> None:
    rendered = api_reference(document)
    linked = {part.split(")")[0] for part in rendered.split("](#problem-")[1:]}
    anchored = {part.split('"')[0] for part in rendered.split('<a id="problem-')[1:]}
    assert linked
    assert linked <= anchored
    assert len(anchored) == len(document["x-problem-types"])


def test_one_command_regenerates_both_files(tmp_path: Path) -> None:
    """`memgate openapi --markdown docs/api.md` writes what the two drift tests compare with."""
    from service.__main__ import main

    spec, reference = tmp_path / "openapi.yaml", tmp_path / "api.md"
    assert main(["openapi", "--output", str(spec), "--markdown", str(reference)]) == 0
    assert spec.read_text() == (ROOT / "openapi.yaml").read_text()
    assert reference.read_text() == (ROOT / API_REFERENCE).read_text()
