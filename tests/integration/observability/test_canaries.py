"""Canary strings written as memory content, query text and filters never reach a log line, a
span (name, attribute, event, status) or a metric."""

from __future__ import annotations

import base64
import json
import logging
from dataclasses import dataclass, field
from typing import Any

import pytest
from litestar.testing import AsyncTestClient
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from service.observability.metrics import create_metrics_app
from service.observability.telemetry import metrics_text
from service.runtime import Runtime
from tests.fixtures.api import Agent, Api
from tests.fixtures.canaries import (
    CANARY_FILTER,
    CANARY_QUERY,
    CANARY_VALUE,
    assert_no_canary,
    captured_logs,
)
from tests.integration.audit.support import audit_rows


@dataclass
class Sinks:
    """What the app emitted while the canaries went through it."""

    log_events: list[Any] = field(default_factory=list)
    stdlib_logs: str = ""
    spans: list[str] = field(default_factory=list)
    metrics: str = ""
    scraped: str = ""
    audit: str = ""
    secrets: tuple[str, ...] = ()


async def _send_canaries(api: Api, alice: Agent) -> None:
    subject = f"note:{CANARY_FILTER}"
    await api.remember(
        alice,
        subject=subject,
        key="secret.note",
        value=f"the code is {CANARY_VALUE}",
        metadata={"hint": CANARY_VALUE},
    )
    # Floor off: the query's canary is not the value's, and the hit is what is asserted.
    response = await api.search(
        alice, f"what is {CANARY_QUERY}", filters={"subject": subject}, k=5, min_score=0
    )
    assert response.status_code == 200, response.text
    assert len(response.json()["hits"]) == 1
    listed = await api.http.get(
        "/v1/memories", params={"subject": subject, "key": "secret.note"}, headers=alice.headers
    )
    assert listed.status_code == 200, listed.text
    assert len(listed.json()["items"]) == 1
    # Refused input travels further (validation and problem details): it must not leak either.
    refused = await api.http.get(
        "/v1/memories", params={"subject": f"bad {CANARY_FILTER}"}, headers=alice.headers
    )
    assert refused.status_code in {400, 422}, refused.text
    too_long = await api.search(alice, CANARY_QUERY * 1000)
    assert too_long.status_code in {400, 422}, too_long.text
    # Unauthenticated callers choose what they send: a client id and an issuer name.
    refused_client = await api.http.post(
        "/oauth/token",
        data={"grant_type": "client_credentials", "client_id": CANARY_FILTER, "client_secret": "x"},
    )
    assert refused_client.status_code == 401, refused_client.text
    forged = ".".join(
        base64.urlsafe_b64encode(json.dumps(part).encode()).decode().rstrip("=")
        for part in ({"alg": "ES256", "typ": "at+jwt"}, {"iss": CANARY_FILTER, "sub": "x"})
    )
    bad_issuer = await api.http.get(
        "/v1/memories", headers={"Authorization": f"Bearer {forged}.c2ln"}
    )
    assert bad_issuer.status_code == 401, bad_issuer.text


@pytest.fixture
async def sinks(
    api: Api,
    span_exporter: InMemorySpanExporter,
    caplog: pytest.LogCaptureFixture,
    owner_engine: AsyncEngine,
) -> Sinks:
    alice = await api.new_agent("alice")
    span_exporter.clear()
    caplog.set_level(logging.DEBUG)
    with captured_logs() as events:
        await _send_canaries(api, alice)
    spans = [span.to_json() for span in span_exporter.get_finished_spans()]
    async with AsyncTestClient(app=create_metrics_app()) as scraper:
        scraped = await scraper.get("/metrics")
    assert scraped.status_code == 200
    # httpx is the test's own client logging the URLs it requests, not the app.
    app_records = [record for record in caplog.records if not record.name.startswith("httpx")]
    return Sinks(
        log_events=events,
        stdlib_logs="\n".join(record.getMessage() for record in app_records),
        spans=spans,
        metrics=metrics_text().decode(),
        scraped=scraped.text,
        audit=repr(await audit_rows(owner_engine)),
        secrets=(alice.token, alice.secret, api.admin.token, api.admin.secret),
    )


def test_canaries_never_reach_the_logs(sinks: Sinks) -> None:
    assert [event for event in sinks.log_events if event.get("event") == "request"]
    assert_no_canary(repr(sinks.log_events), where="structlog events")
    assert_no_canary(sinks.stdlib_logs, where="standard-library log records")


def test_canaries_never_reach_a_span(sinks: Sinks) -> None:
    assert len(sinks.spans) > 10, "the requests produced (almost) no spans"
    for rendered in sinks.spans:
        assert_no_canary(rendered, where="a span")


def test_canaries_tokens_and_secrets_never_reach_the_audit_log(sinks: Sinks) -> None:
    assert "memory.search" in sinks.audit
    assert "auth.token" in sinks.audit
    assert_no_canary(sinks.audit, *sinks.secrets, where="the audit log")


def test_canaries_never_reach_the_metrics(sinks: Sinks) -> None:
    assert "memgate_search_duration" in sinks.metrics
    assert_no_canary(sinks.metrics, where="the metrics registry")
    assert_no_canary(sinks.scraped, where="GET /metrics")


async def test_a_failed_statement_leaves_its_type_not_its_message(
    runtime: Runtime, span_exporter: InMemorySpanExporter
) -> None:
    """PostgreSQL's messages quote the value they refused; the SQL span keeps the error's type
    and SQLSTATE only."""
    span_exporter.clear()
    with pytest.raises(DBAPIError, match=CANARY_VALUE):
        async with runtime.engine.connect() as conn:
            await conn.execute(text("SELECT CAST(:value AS uuid)"), {"value": CANARY_VALUE})
    [failed] = [
        span
        for span in span_exporter.get_finished_spans()
        if span.status.status_code == StatusCode.ERROR
    ]
    assert failed.attributes is not None
    assert failed.attributes["error.type"] == "InvalidTextRepresentation"
    assert failed.attributes["db.response.status_code"] == "22P02"
    assert_no_canary(failed.to_json(), where="a failed SQL span")
