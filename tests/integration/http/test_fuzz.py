"""Schemathesis over openapi.yaml: every operation, with cases generated from its schema (valid
ones, then ones that break it), sent to the real app with a token that holds every scope. No
answer is a server error, each matches the status codes and schemas openapi.yaml declares, and
every refusal of bad input is a problem a model can act on."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import schemathesis
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from service.auth.scopes import ALL_SCOPES
from tests.fixtures.api import Api, TestClient

SCHEMA = yaml.safe_load((Path(__file__).parents[3] / "openapi.yaml").read_text())
CASES_PER_OPERATION = int(os.environ.get("MEMGATE_FUZZ_CASES", "6"))
"""Cases per operation and mode; raise it for a longer hunt (the suite's run stays short)."""
CHECKS = [
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


def _cases(operation: Any, mode: GenerationMode) -> list[Any]:
    """A fixed set of cases for one operation (derandomized: the same every run)."""
    drawn: list[Any] = []

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=CASES_PER_OPERATION,
        database=None,
        derandomize=True,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def collect(case: Any) -> None:
        drawn.append(case)

    try:
        collect()
    except Unsatisfiable:  # nothing of it can be made invalid (no parameters, no body)
        return []
    return drawn


async def _send(http: TestClient, case: Any, token: str) -> Any:
    sent = case.as_transport_kwargs(
        base_url=str(http.base_url), headers={"Authorization": f"Bearer {token}"}
    )
    sent.pop("timeout", None)
    if not sent.get("cookies"):
        sent.pop("cookies", None)
    sent.pop("allow_redirects", None)
    return await http.request(**sent)


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
async def test_no_generated_case_gets_a_server_error_or_an_undeclared_answer(
    api: Api, http: TestClient, mode: GenerationMode
) -> None:
    created = await api.new_client(api.admin.principal_id, sorted(ALL_SCOPES), kind="admin")
    token = await api.access_token(created["client"]["client_id"], created["client_secret"])
    schema = schemathesis.openapi.from_dict(SCHEMA)
    failures: list[str] = []
    sent, answered = 0, Counter[int]()
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result.err()  # openapi.yaml is a valid document
        operation = result.ok()
        for case in _cases(operation, mode):
            response = await _send(http, case, token)
            sent += 1
            answered[response.status_code] += 1
            problem = response.headers.get("content-type", "").startswith(
                "application/problem+json"
            )
            if response.status_code >= 500 or (response.status_code >= 400 and not problem):
                failures.append(f"{operation.label}: {response.status_code} {response.text[:200]}")
                continue
            try:
                case.validate_response(
                    response,
                    checks=CHECKS
                    + ([negative_data_rejection] if mode is GenerationMode.NEGATIVE else []),
                )
            except BaseExceptionGroup as group:  # schemathesis' failures, each named
                failures += [f"{operation.label}: {failure}" for failure in group.exceptions]
    assert failures == []
    assert sent >= 50 * CASES_PER_OPERATION  # every operation (77), less those with no input
    # The token held every scope: most answers got past the entrance to the operation itself.
    assert answered[401] < sent / 2
    assert sum(n for status, n in answered.items() if status < 300) > 0
