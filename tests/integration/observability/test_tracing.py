"""A search request is one trace: the server span named after the route, and beneath it
authentication, the visibility predicate, the embedding, the ranking and the SQL."""

from __future__ import annotations

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from sqlalchemy import text

from tests.fixtures.api import Api
from tests.fixtures.canaries import captured_logs

SQL_SCOPE = "opentelemetry.instrumentation.sqlalchemy"


def _root_of(span: ReadableSpan, by_id: dict[int, ReadableSpan]) -> ReadableSpan:
    node = span
    while node.parent is not None:
        node = by_id[node.parent.span_id]  # KeyError: a parent outside the exported trace
    return node


def _named(spans: list[ReadableSpan], name: str) -> ReadableSpan:
    matching = [span for span in spans if span.name == name]
    assert len(matching) == 1, (name, [span.name for span in spans])
    return matching[0]


async def test_a_search_is_one_trace_with_the_expected_spans(
    api: Api, span_exporter: InMemorySpanExporter
) -> None:
    alice = await api.new_agent("alice")
    await api.remember(alice, key="deploy.window", value="Billing deploys on Fridays")
    span_exporter.clear()

    with captured_logs() as events:
        response = await api.search(alice, "when does billing deploy?", k=3)
    assert response.status_code == 200, response.text
    assert len(response.json()["hits"]) == 1

    finished = list(span_exporter.get_finished_spans())
    # The group commit that made the search's audit row durable is a trace of its own (it
    # serves many calls): one root span with the rows it appended, and nothing else.
    [group] = [span for span in finished if span.name == "audit.group_commit"]
    assert group.parent is None
    assert group.attributes == {"memgate.audit.rows": 1}
    spans = [span for span in finished if span.context.trace_id != group.context.trace_id]
    [server] = [span for span in spans if span.kind == SpanKind.SERVER]
    assert server.name == "POST /v1/memories/search"
    assert server.parent is None
    assert server.attributes is not None
    assert server.attributes["http.route"] == "/v1/memories/search"
    assert server.attributes["http.status_code"] == 200

    trace_id = server.context.trace_id
    assert {span.context.trace_id for span in spans} == {trace_id}
    by_id = {span.context.span_id: span for span in spans}
    assert all(_root_of(span, by_id) is server for span in spans)

    names = {span.name for span in spans}
    expected = {"auth.authenticate", "policy.visible", "embedding.embed", "memory.rank"}
    assert expected | {"audit.append"} <= names
    sql = [
        span
        for span in spans
        if span.instrumentation_scope and span.instrumentation_scope.name == SQL_SCOPE
    ]
    assert sql, names

    # The ranking statement runs inside memory.rank; the principal lookup inside authentication.
    rank, auth = _named(spans, "memory.rank"), _named(spans, "auth.authenticate")
    assert [s for s in sql if s.parent and s.parent.span_id == rank.context.span_id]
    assert [s for s in sql if s.parent and s.parent.span_id == auth.context.span_id]
    assert rank.attributes == {
        "memgate.search.k": 3,
        "memgate.search.mode": "hybrid",
        "memgate.search.hits": 1,
        "memgate.search.strategy": "exact",
    }
    embedding = _named(spans, "embedding.embed")
    assert embedding.attributes == {
        "memgate.embedding.model": "wordllama/l2_supercat",
        "memgate.embedding.count": 1,
    }

    # The access line was written inside the server span: logs and traces join on the ids.
    [line] = [event for event in events if event.get("event") == "request"]
    assert line["trace_id"] == format(trace_id, "032x")
    assert line["span_id"] == format(server.context.span_id, "016x")

    # The audit row of the search names the same trace: a read's row is group-committed, and
    # the search's trace shows the wait until it was durable (the flush itself serves many
    # calls and is a trace of its own).
    assert _named(spans, "audit.append").attributes == {"memgate.audit.path": "group"}
    async with api.runtime.engine.connect() as conn:
        audited = await conn.scalar(
            text("SELECT count(*) FROM audit_events WHERE trace_id = :trace AND action = :action"),
            {"trace": format(trace_id, "032x"), "action": "memory.search"},
        )
    assert audited == 1


async def test_unmatched_routes_name_no_path(api: Api, span_exporter: InMemorySpanExporter) -> None:
    span_exporter.clear()
    response = await api.http.get("/v1/no-such-thing/0190f0e0-aaaa-7bbb-8ccc-123456789abc")
    assert response.status_code == 404
    [server] = [s for s in span_exporter.get_finished_spans() if s.kind == SpanKind.SERVER]
    assert server.name == "GET unmatched"
    assert server.attributes is not None
    assert server.attributes["http.route"] == "unmatched"


async def test_the_server_span_holds_no_raw_path_url_or_client_details(
    api: Api, span_exporter: InMemorySpanExporter
) -> None:
    """Review item 12: `http.target`, `http.url` and `http.user_agent` carried the raw path (ids)
    and the caller's software; only the route template, method and status may be recorded."""
    alice = await api.new_agent("alice")
    memory = await api.remember(alice, key="deploy.window", value="Billing deploys on Fridays")
    span_exporter.clear()
    response = await api.http.get(
        f"/v1/memories/{memory['id']}",
        params={"fields": "all"},
        headers={**alice.headers, "User-Agent": "canary-agent/1.0", "X-Forwarded-For": "10.9.8.7"},
    )
    assert response.status_code in (200, 422), response.text
    [server] = [s for s in span_exporter.get_finished_spans() if s.kind == SpanKind.SERVER]
    attributes = dict(server.attributes or {})
    assert server.name == "GET /v1/memories/{memory_id}"
    assert attributes["http.route"] == "/v1/memories/{memory_id}"
    assert attributes["http.method"] == "GET"
    assert attributes["http.status_code"] == response.status_code
    # Only these keys: nothing else a request can put into the span.
    assert set(attributes) <= {
        "http.route", "http.method", "http.status_code", "http.scheme", "http.flavor",
        "error.type",
    }  # fmt: skip
    everything = repr(attributes) + repr([event.attributes for event in server.events])
    for leak in (memory["id"], "canary-agent", "fields", "10.9.8.7", "127.0.0.1", "localhost"):
        assert leak not in everything


async def test_a_caller_traceparent_is_continued(
    api: Api, span_exporter: InMemorySpanExporter
) -> None:
    span_exporter.clear()
    trace_hex = "0af7651916cd43dd8448eb211c80319c"
    response = await api.http.get(
        "/healthz", headers={"traceparent": f"00-{trace_hex}-b7ad6b7169203331-01"}
    )
    assert response.status_code == 200
    [server] = [s for s in span_exporter.get_finished_spans() if s.kind == SpanKind.SERVER]
    assert format(server.context.trace_id, "032x") == trace_hex
    assert server.parent is not None
    assert server.parent.span_id == 0xB7AD6B7169203331
