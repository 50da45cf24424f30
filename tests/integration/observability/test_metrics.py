"""`GET /metrics` (on the metrics listener): Prometheus text with request, search and
embedding latencies and pool use, labelled by route template and status, never by raw path."""

from __future__ import annotations

import re
from collections.abc import Iterator

from litestar.testing import AsyncTestClient
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from service.observability.metrics import create_metrics_app
from tests.fixtures.api import Api

STATUS = "http_response_status_code"


def _samples(text: str, name: str) -> Iterator[Sample]:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                yield sample


async def test_metrics_are_labelled_by_route_template(
    api: Api, span_exporter: InMemorySpanExporter
) -> None:
    alice = await api.new_agent("alice")
    memory = await api.remember(alice, key="deploy.window", value="Billing deploys on Fridays")
    assert (await api.search(alice, "when does billing deploy?")).status_code == 200
    read = await api.http.get(f"/v1/memories/{memory['id']}", headers=alice.headers)
    assert read.status_code == 200
    missing = await api.http.get(f"/v1/nothing-here/{memory['id']}", headers=alice.headers)
    assert missing.status_code == 404

    async with AsyncTestClient(app=create_metrics_app()) as scraper:
        response = await scraper.get("/metrics")  # no token: scrapers have none
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    text = response.text

    requests = list(_samples(text, "http_server_request_duration_seconds_count"))
    labelled = {
        (
            s.labels["http_route"],
            s.labels["http_request_method"],
            s.labels["http_response_status_code"],
        )
        for s in requests
    }
    assert {
        ("/v1/memories", "POST", "201"),
        ("/v1/memories/search", "POST", "200"),
        ("/v1/memories/{memory_id}", "GET", "200"),
        ("unmatched", "GET", "404"),
    } <= labelled
    assert all(s.value >= 1 for s in requests)

    [search] = _samples(text, "memgate_search_duration_seconds_count")
    assert search.value >= 1
    embeddings = list(_samples(text, "memgate_embedding_duration_seconds_count"))
    # The registry is process-wide: other tests' stand-in providers may have added their own
    # model ids, but every label is a `provider/model` id, never text.
    models = {s.labels["memgate_embedding_model"] for s in embeddings}
    assert "wordllama/l2_supercat" in models
    assert all(re.fullmatch(r"[a-z]+/[\w.@:-]+", m) for m in models), models

    pool = {
        s.labels["db_client_connection_state"]: s.value
        for s in _samples(text, "db_client_connection_count")
    }
    assert set(pool) == {"used", "idle"}
    assert pool["idle"] >= 1  # the requests above returned their connections
    [limit] = _samples(text, "db_client_connection_max")
    assert limit.value >= api.runtime.settings.database.pool_size

    # Ids from paths, tokens and principals never become label values.
    for raw in (memory["id"], alice.principal_id, api.tenant_id, alice.client_id):
        assert raw not in text
