"""What the repository says about itself holds: docs name only files that exist, the token
endpoint's description covers both grants it serves, the audit docs match the recorder, and the
license is declared the way setuptools will keep accepting (an SPDX expression and its file)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

from service.http.openapi_doc import render_openapi

ROOT = Path(__file__).resolve().parents[2]


def test_docs_and_code_cite_no_file_outside_the_repository() -> None:
    cited = re.compile(r"\b(DESIGN\.md|perf\.md|DESIGN §)")
    offenders = [
        str(path.relative_to(ROOT))
        for folder in ("docs", "service", "migrations")
        for path in (ROOT / folder).rglob("*")
        if path.suffix in {".md", ".py"} and cited.search(path.read_text())
    ]
    offenders += ["README.md"] if cited.search((ROOT / "README.md").read_text()) else []
    assert offenders == []
    assert (ROOT / "docs" / "design.md").is_file()


def test_the_token_endpoint_description_names_token_exchange() -> None:
    spec = yaml.safe_load(render_openapi())
    description = spec["paths"]["/oauth/token"]["post"]["description"]
    assert "client credentials" in description
    assert "RFC 8693 token exchange" in description


def test_audit_docs_do_not_call_delegation_empty() -> None:
    row = next(
        line
        for line in (ROOT / "docs" / "audit.md").read_text().splitlines()
        if line.startswith("| `delegation` |")
    )
    assert "empty today" not in row
    assert "token exchange" in row


def test_license_is_an_spdx_expression_with_its_file() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["license"] == "Apache-2.0"
    assert project["project"]["license-files"] == ["LICENSE"]
    assert "setuptools>=77" in project["build-system"]["requires"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text
    assert "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
