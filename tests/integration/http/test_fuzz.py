"""Schemathesis over openapi.yaml: every operation, with cases generated from its schema (valid
ones, then ones that break it), sent to the real app with a token that holds every scope. No
answer is a server error, each matches the status codes and schemas openapi.yaml declares, and
every refusal of bad input is a problem a model can act on.

The canary oracle (issue 18) rides along: another principal and another tenant hold memories
with canaries, and every memory value the fuzzer writes gets a canary of its own. After the
run, no answer the fuzzer got holds another principal's canary, and no log line, span or audit
row holds any canary."""

from __future__ import annotations

import logging
import os
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import schemathesis
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from schemathesis import GenerationMode
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from sqlalchemy.ext.asyncio import AsyncEngine

from service.audit.rows import PLATFORM_TENANT
from service.auth.scopes import ALL_SCOPES
from tests.fixtures.api import Api, TestClient
from tests.fixtures.canaries import captured_logs
from tests.integration.audit.support import audit_rows

SCHEMA = yaml.safe_load((Path(__file__).parents[3] / "openapi.yaml").read_text())
CASES_PER_OPERATION = int(os.environ.get("MEMGATE_FUZZ_CASES", "6"))
"""Cases per operation and mode; raise it for a longer hunt (the suite's run stays short)."""
UNAUDITED_PROBES = {"/healthz", "/readyz"}
"""Not audited by design (docs/audit.md, "What a row holds")."""
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


@dataclass
class Oracle:
    """The canaries in play: `others` (written by principals the fuzzer is not) and `own`
    (put into the values the fuzzer writes)."""

    others: list[str] = field(default_factory=list)
    own: list[str] = field(default_factory=list)

    def mark(self, body: Any) -> None:
        """Prefix every string `value` in a request body with a fresh canary."""
        if isinstance(body, list):
            for item in body:
                self.mark(item)
        elif isinstance(body, dict):
            for name, item in body.items():
                if name == "value" and isinstance(item, str):
                    self.own.append(f"canary-fuzz-{uuid.uuid4().hex[:12]}")
                    body[name] = f"{self.own[-1]} {item}"
                else:
                    self.mark(item)


async def _others_canaries(api: Api) -> list[str]:
    """Memories of a second principal and of another tenant, each with its own canary in its
    value and metadata: the fuzzer's all-scope admin token holds no grant on either."""
    canaries = []
    for owner_api, name in ((api, "alice"), (await api.other_tenant(), "carol")):
        agent = await owner_api.new_agent(name)
        for n in range(3):
            canary = f"canary-{name}-{uuid.uuid4().hex[:12]}"
            await owner_api.remember(
                agent, key=f"note.{n}", value=f"the note {canary}", metadata={"c": canary}
            )
            canaries.append(canary)
    return canaries


async def _send(http: TestClient, case: Any, token: str | None) -> Any:
    sent = case.as_transport_kwargs(
        base_url=str(http.base_url),
        headers={} if token is None else {"Authorization": f"Bearer {token}"},
    )
    sent.pop("timeout", None)
    if not sent.get("cookies"):
        sent.pop("cookies", None)
    sent.pop("allow_redirects", None)
    return await http.request(**sent)


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
async def test_no_generated_case_gets_a_server_error_or_an_undeclared_answer(
    api: Api,
    http: TestClient,
    mode: GenerationMode,
    span_exporter: InMemorySpanExporter,
    caplog: pytest.LogCaptureFixture,
    owner_engine: AsyncEngine,
) -> None:
    created = await api.new_client(api.admin.principal_id, sorted(ALL_SCOPES), kind="admin")
    token = await api.access_token(created["client"]["client_id"], created["client_secret"])
    oracle = Oracle(others=await _others_canaries(api))
    schema = schemathesis.openapi.from_dict(SCHEMA)
    failures: list[str] = []
    answers: list[str] = []
    sent, probed, answered = 0, 0, Counter[int]()
    rows_before = Counter(row["tenant_id"] for row in await audit_rows(owner_engine))
    span_exporter.clear()
    caplog.set_level(logging.DEBUG)
    with captured_logs() as log_events:
        for result in schema.get_all_operations():
            assert isinstance(result, Ok), result.err()  # openapi.yaml is a valid document
            operation = result.ok()
            for case in _cases(operation, mode):
                oracle.mark(case.body)
                response = await _send(http, case, token)
                answers.append(f"{operation.label}: {response.headers} {response.text}")
                failures += _failures(operation, case, response, mode)
                sent += 1
                answered[response.status_code] += 1
                probed += operation.path in UNAUDITED_PROBES
    assert failures == []
    assert sent >= 50 * CASES_PER_OPERATION  # every operation (77), less those with no input
    # The token held every scope: most answers got past the entrance to the operation itself.
    assert answered[401] < sent / 2
    assert sum(n for status, n in answered.items() if status < 300) > 0
    # Audit completeness: one row per call but the probes, in the fuzzer's tenant (its token
    # names it, and the token endpoint's refusals of unknown clients go to the platform's
    # chain), and the chain verifies.
    rows = await audit_rows(owner_engine)
    added = Counter(row["tenant_id"] for row in rows) - rows_before
    assert added[uuid.UUID(api.tenant_id)] + added[PLATFORM_TENANT] == sent - probed, added
    assert set(added) <= {uuid.UUID(api.tenant_id), PLATFORM_TENANT}, added
    verified = await http.get("/v1/audit/verify", headers={"Authorization": f"Bearer {token}"})
    assert verified.status_code == 200, verified.text
    assert verified.json()["ok"] is True, verified.json()
    # The canary oracle.
    assert oracle.own, "the fuzzer wrote no value"
    if mode is GenerationMode.POSITIVE:
        # Its canaries came back to it: they were stored, so the sinks below could have had them.
        assert any(c in answer for c in oracle.own for answer in answers)
    for answer in answers:
        assert [c for c in oracle.others if c in answer] == [], answer[:300]
    app_records = [r for r in caplog.records if not r.name.startswith(("httpx", "hypothesis"))]
    sinks = {
        "structlog events": repr(log_events),
        "standard-library log records": "\n".join(r.getMessage() for r in app_records),
        "a span": "\n".join(span.to_json() for span in span_exporter.get_finished_spans()),
        "the audit log": repr(rows),
    }
    assert log_events
    assert span_exporter.get_finished_spans()
    for where, rendered in sinks.items():
        leaked = [c for c in (*oracle.others, *oracle.own) if c in rendered]
        assert leaked == [], f"{leaked[:3]} reached {where}"


def _failures(operation: Any, case: Any, response: Any, mode: GenerationMode) -> list[str]:
    """What is wrong with one answer: a server error, a refusal that is not a problem, or
    whatever schemathesis' checks find."""
    problem = response.headers.get("content-type", "").startswith("application/problem+json")
    if response.status_code >= 500 or (response.status_code >= 400 and not problem):
        return [f"{operation.label}: {response.status_code} {response.text[:200]}"]
    try:
        case.validate_response(
            response,
            checks=CHECKS + ([negative_data_rejection] if mode is GenerationMode.NEGATIVE else []),
        )
    except BaseExceptionGroup as group:  # schemathesis' failures, each named
        return [f"{operation.label}: {failure}" for failure in group.exceptions]
    return []


def _needs_a_token(operation: Any) -> bool:
    """openapi.yaml's own word: the document's `security` unless the operation says `[]`."""
    declared = operation.definition.raw.get("security", SCHEMA["security"])
    return bool(declared)


async def test_no_generated_case_gets_past_a_missing_or_forged_token(http: TestClient) -> None:
    """schemathesis' ignored-auth check, in-process: every generated valid case of every
    operation that needs a token, sent without one and with a forged one, is refused 401 with
    a challenge and a problem body; the operations documented as public ask for no token."""
    schema = schemathesis.openapi.from_dict(SCHEMA)
    refused, public, failures = 0, 0, []
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result.err()
        operation = result.ok()
        for case in _cases(operation, GenerationMode.POSITIVE)[:2]:
            for token in (None, "eyJhbGciOiJub25lIn0.eyJzdWIiOiJ4In0."):
                response = await _send(http, case, token)
                challenge = response.headers.get("www-authenticate", "")
                if not _needs_a_token(operation):
                    # Answered without a bearer token (the token endpoint may still refuse the
                    # generated client credentials: 401 invalid_client, RFC 6749 5.2).
                    public += 1
                    if challenge.startswith("Bearer"):
                        failures.append(f"{operation.label}: public, yet asks for a token")
                    continue
                refused += 1
                if (
                    response.status_code != 401
                    or not challenge.startswith("Bearer")
                    or not response.headers["content-type"].startswith("application/problem")
                ):
                    failures.append(f"{operation.label}: {response.status_code} {challenge!r}")
    assert failures == []
    assert refused >= 4 * 50
    assert public > 0
