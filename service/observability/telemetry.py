"""OpenTelemetry: traces and metrics.

Metrics are pushed by OTLP over HTTP when `OTEL_EXPORTER_OTLP_ENDPOINT` is set, and rendered as
Prometheus text at `/metrics` on the metrics listener (service.observability.metrics; from a
registry of our own, not the global one). Spans go to OTLP when it is configured; otherwise
they are not recorded at all (a sampler that drops them), but still carry a trace id: audit rows
and logs name the call's trace either way.

Nothing content-bearing is recorded: span attributes and metric labels are counts, `k`, model
ids, route templates, methods and statuses — never memory text, query text, subjects, keys,
tokens, query strings, raw paths, user agents or client addresses. The server span is our own
(`otel_asgi`), named after the route template, and errors are recorded as their type only
(exception messages and database error texts can quote input).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Iterable, Iterator, MutableMapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast

from opentelemetry import metrics, propagate, trace
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.instrumentation.asgi import asgi_getter
from opentelemetry.instrumentation.sqlalchemy.engine import EngineTracer
from opentelemetry.instrumentation.sqlalchemy.engine import _handle_error as _otel_handle_error
from opentelemetry.instrumentation.sqlalchemy.version import (
    __version__ as _sqlalchemy_otel_version,
)
from opentelemetry.metrics import CallbackOptions, NoOpMeter, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.util.types import Attributes
from prometheus_client import CollectorRegistry, generate_latest
from sqlalchemy import event
from sqlalchemy.engine import ExceptionContext
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import QueuePool

from service.settings import ObservabilitySettings

if TYPE_CHECKING:
    from litestar.types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "AUDIT_APPEND_DURATION",
    "EMBEDDING_DURATION",
    "REQUEST_DURATION",
    "SEARCH_DURATION",
    "SERVER_REJECTED",
    "configure_telemetry",
    "http_method",
    "instrument_engine",
    "metrics_text",
    "otel_asgi",
    "route_of",
    "span",
    "timed",
    "tracer",
]

tracer = trace.get_tracer("memgate")
"""The app's tracer (a proxy: spans are real once `configure_telemetry` has run)."""

_meter = metrics.get_meter("memgate")

# Seconds; from sub-millisecond (embedding one short text, a primary-key read) to 10 s.
_LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
    7.5, 10.0,
)  # fmt: skip

REQUEST_DURATION = _meter.create_histogram(
    "http.server.request.duration",
    unit="s",
    description="HTTP request latency by route template (or 'unmatched'), method and status.",
    explicit_bucket_boundaries_advisory=_LATENCY_BUCKETS,
)
SEARCH_DURATION = _meter.create_histogram(
    "memgate.search.duration",
    unit="s",
    description="Whole search operation: embedding the query, visibility and ranking.",
    explicit_bucket_boundaries_advisory=_LATENCY_BUCKETS,
)
EMBEDDING_DURATION = _meter.create_histogram(
    "memgate.embedding.duration",
    unit="s",
    description="One embedding call, by provider/model id.",
    explicit_bucket_boundaries_advisory=_LATENCY_BUCKETS,
)
AUDIT_APPEND_DURATION = _meter.create_histogram(
    "memgate.audit.append.duration",
    unit="s",
    description="Appending one audit row; memgate.audit.path is in_request or separate.",
    explicit_bucket_boundaries_advisory=_LATENCY_BUCKETS,
)

SERVER_REJECTED = _meter.create_counter(
    "memgate.http.server.rejected",
    unit="{request}",
    description="Requests the HTTP server's parser refused (400) before the app: never audited.",
)

READ_ROUTE = _meter.create_counter(
    "memgate.db.read_route",
    unit="{call}",
    description="Read-only calls with a read replica configured, by where they ran "
    "(memgate.db.route: replica or primary) and why not on the replica "
    "(memgate.db.route.reason).",
)

_REGISTRY = CollectorRegistry()
"""What `/metrics` renders; ours alone, so nothing else registered in-process leaks into it."""

_configured = False
_configure_lock = threading.Lock()
_statements_traced = False
"""Whether engines get SQL spans: only when spans are exported (`configure_telemetry`). A
non-recording statement span still cost its listener ~0.1 ms per statement (the statement's
first word is found by splitting the whole text, 7 KB for a search)."""


def configure_telemetry(
    settings: ObservabilitySettings, *, span_processors: Sequence[SpanProcessor] = ()
) -> bool:
    """Install the global tracer and meter providers. Idempotent: the first call wins (and
    returns True; later calls change nothing and return False).

    Metrics: Prometheus text for the metrics listener's `/metrics`; also pushed by OTLP/HTTP when
    `settings.otlp_endpoint` is set. Traces: OTLP/HTTP when configured, plus `span_processors`
    (tests pass an in-memory exporter); with neither, nothing would read a span, so none is
    recorded (`ALWAYS_OFF`: a non-recording span costs no attributes, events or processor
    calls, and still has a trace id, its parent's or a new one).
    """
    global _configured, _statements_traced  # noqa: PLW0603 (one process-wide provider, set once)
    with _configure_lock:
        if _configured:
            return False
        _configured = True
    resource = Resource.create({SERVICE_NAME: settings.service_name})
    exporting = bool(span_processors) or bool(settings.otlp_endpoint)
    _statements_traced = exporting
    tracer_provider = TracerProvider(resource=resource, sampler=None if exporting else ALWAYS_OFF)
    for processor in span_processors:
        tracer_provider.add_span_processor(processor)
    readers: list[MetricReader] = [PrometheusMetricReader(registry=_REGISTRY)]
    if settings.otlp_endpoint:
        tracer_provider.add_span_processor(
            BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{settings.otlp_endpoint}/v1/traces"))
        )
        readers.append(
            PeriodicExportingMetricReader(
                OTLPMetricExporter(endpoint=f"{settings.otlp_endpoint}/v1/metrics")
            )
        )
    trace.set_tracer_provider(tracer_provider)
    metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=readers))
    return True


def metrics_text() -> bytes:
    """The Prometheus text exposition of every memgate metric (empty before configuration)."""
    return generate_latest(_REGISTRY)


@contextmanager
def span(name: str, attributes: Attributes = None) -> Iterator[Span]:
    """A child span of whatever is current. A failure is recorded as its exception type only:
    messages can quote the input (a problem's detail, a database error)."""
    with tracer.start_as_current_span(
        name, attributes=attributes, record_exception=False, set_status_on_exception=False
    ) as current:
        try:
            yield current
        except Exception as exc:
            current.set_attribute("error.type", type(exc).__qualname__)
            current.set_status(Status(StatusCode.ERROR))
            raise


@contextmanager
def timed(histogram: metrics.Histogram, attributes: Attributes = None) -> Iterator[None]:
    """Record the block's wall time in seconds, whether it returns or raises."""
    started = time.perf_counter()
    try:
        yield
    finally:
        histogram.record(time.perf_counter() - started, attributes)


# --- database ---------------------------------------------------------------------------------

_ENGINES: weakref.WeakSet[AsyncEngine] = weakref.WeakSet()
_ENGINES_LOCK = threading.Lock()
_SQL_TRACER = trace.get_tracer("opentelemetry.instrumentation.sqlalchemy", _sqlalchemy_otel_version)
# The instrumentation's own connection counter would be a second pool metric: we observe the
# pools directly instead (below), so it gets an instrument that records nothing.
_UNUSED_USAGE_COUNTER = NoOpMeter("memgate.unused").create_up_down_counter("unused")


def instrument_engine(engine: AsyncEngine) -> None:
    """Count this engine's pool connections and, when spans are exported, trace every
    statement of it (configure telemetry first).

    Per engine rather than SQLAlchemyInstrumentor().instrument(): the instrumentor is a process
    singleton that instruments once, and tests build an engine per database.
    """
    with _ENGINES_LOCK:
        if engine in _ENGINES:
            return
        _ENGINES.add(engine)
    if not _statements_traced:
        return
    sync_engine = engine.sync_engine
    EngineTracer(_SQL_TRACER, sync_engine, _UNUSED_USAGE_COUNTER)  # type: ignore[no-untyped-call]
    # The stock error hook puts str(exception) in the span status; PostgreSQL messages quote
    # values ('Key (subject)=(...) already exists'), so record the type and SQLSTATE instead.
    event.remove(sync_engine, "handle_error", _otel_handle_error)
    event.listen(sync_engine, "handle_error", _end_failed_statement_span)


def _end_failed_statement_span(context: ExceptionContext) -> None:
    fail_statement_span(
        getattr(context.execution_context, "_otel_span", None), context.original_exception
    )


def fail_statement_span(current: Span | None, original: BaseException) -> None:
    """End a statement's span as failed, naming the error's type and SQLSTATE only."""
    if current is None:
        return
    if current.is_recording():
        current.set_attribute("error.type", type(original).__qualname__)
        sqlstate = getattr(original, "sqlstate", None)
        if isinstance(sqlstate, str):
            current.set_attribute("db.response.status_code", sqlstate)
        current.set_status(Status(StatusCode.ERROR))
    current.end()


def _pool_counts() -> tuple[int, int, int]:
    """(used, idle, max) summed over the live engines of this process."""
    used = idle = limit = 0
    with _ENGINES_LOCK:
        engines = list(_ENGINES)
    for engine in engines:
        pool = engine.sync_engine.pool
        if isinstance(pool, QueuePool):
            used += pool.checkedout()
            idle += pool.checkedin()
            limit += pool.size() + max(pool._max_overflow, 0)
    return used, idle, limit


def _observe_connections(_options: CallbackOptions) -> Iterable[Observation]:
    used, idle, _ = _pool_counts()
    return [
        Observation(used, {"db.client.connection.state": "used"}),
        Observation(idle, {"db.client.connection.state": "idle"}),
    ]


def _observe_connection_limit(_options: CallbackOptions) -> Iterable[Observation]:
    return [Observation(_pool_counts()[2])]


_meter.create_observable_gauge(
    "db.client.connection.count",
    callbacks=[_observe_connections],
    unit="{connection}",
    description="Database connections of the pool, by state (used = checked out).",
)
_meter.create_observable_gauge(
    "db.client.connection.max",
    callbacks=[_observe_connection_limit],
    unit="{connection}",
    description="The most connections the pool may open (size plus overflow).",
)


# --- HTTP -------------------------------------------------------------------------------------

_KNOWN_METHODS = frozenset(
    {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT"}
)


def http_method(scope: Scope | MutableMapping[str, Any]) -> str:
    """The request method, or `_OTHER` (an arbitrary method must not become a metric label)."""
    method = str(scope.get("method", "")).upper()
    return method if method in _KNOWN_METHODS else "_OTHER"


def route_of(scope: Scope | MutableMapping[str, Any]) -> str:
    """The matched route template (`/v1/memories/{memory_id}`), never the raw path."""
    template = scope.get("path_template")
    if isinstance(template, str) and template:
        return template
    # Litestar gives a mounted ASGI app (`/mcp`) an empty template: the mount's path names it.
    handler = scope.get("route_handler")
    paths = getattr(handler, "paths", None) if getattr(handler, "is_mount", False) else None
    return min(paths) if paths else "unmatched"


def otel_asgi(app: ASGIApp) -> ASGIApp:
    """One server span per request, current while the app (and the access log inside it) runs.

    Our own rather than OpenTelemetry's ASGI middleware, which copies the raw path and URL
    (`http.target`, `http.url`: ids, list filters), the `User-Agent`, the `Host` and the
    client's address into every span, and exception messages into its events. Here the span
    holds the method, scheme and HTTP version from the start and, at response start, is renamed
    `<METHOD> <route template>` with `http.route` and `http.status_code`; a failure is recorded
    as its exception type. A caller's `traceparent` is continued (W3C propagation). Request
    metrics are recorded with the route template by the access log (service.observability.logging).
    """

    async def outer(scope: Scope, receive: Receive, send: Send) -> None:
        scope_type: str = scope["type"]  # a str enum; compared as text to keep litestar out
        if scope_type != "http":
            await app(scope, receive, send)
            return
        method = http_method(scope)
        attributes: dict[str, str] = {"http.method": method, "http.scheme": scope["scheme"]}
        if scope.get("http_version"):
            attributes["http.flavor"] = scope["http_version"]
        with tracer.start_as_current_span(
            method,  # renamed at response start; never the raw path, which holds ids
            context=propagate.extract(cast("Any", scope), getter=asgi_getter),
            kind=SpanKind.SERVER,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as server_span:

            async def naming_send(message: Message) -> None:
                if message["type"] == "http.response.start" and server_span.is_recording():
                    route, status = route_of(scope), message["status"]
                    server_span.update_name(f"{method} {route}")
                    server_span.set_attribute("http.route", route)
                    server_span.set_attribute("http.status_code", status)
                    if status >= 500:
                        server_span.set_status(Status(StatusCode.ERROR))
                await send(message)

            try:
                await app(scope, receive, naming_send)
            except Exception as exc:
                server_span.set_attribute("error.type", type(exc).__qualname__)
                server_span.set_status(Status(StatusCode.ERROR))
                raise

    return outer
