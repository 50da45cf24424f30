"""structlog setup and the per-request log line.

What is logged: request id, method, route template, status, latency, tenant, principal, client,
and the trace and span ids of the current OpenTelemetry span (log lines join their trace).
What never is: bodies (memory text, query text), tokens, secrets, SQL.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import MutableMapping
from typing import Any, TextIO, cast

import structlog
from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, Scope, Send
from opentelemetry import trace
from structlog.typing import EventDict, WrappedLogger

from service.observability.telemetry import REQUEST_DURATION, http_method, route_of


def add_trace_ids(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    """`trace_id` and `span_id` (hex, as tracing backends show them) of the current span."""
    context = trace.get_current_span().get_span_context()
    if context.is_valid:
        event_dict["trace_id"] = format(context.trace_id, "032x")
        event_dict["span_id"] = format(context.span_id, "016x")
    return event_dict


def configure_logging(
    *, json_logs: bool, level: int = logging.INFO, stream: TextIO | None = None
) -> None:
    """`stream`: where log lines go (default stdout; a command whose stdout is its result, like
    `memgate jobs run`, sends them to stderr)."""
    renderer: Any = (
        structlog.processors.JSONRenderer() if json_logs else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            add_trace_ids,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=False,
    )
    # authlib logs whole issued tokens at DEBUG ("Issue token ..."): never let that through.
    logging.getLogger("authlib").setLevel(max(level, logging.WARNING))


_access = structlog.get_logger("memgate.access")
_REQUEST_ID = b"x-request-id"


def _incoming_request_id(scope: Scope) -> str:
    for name, value in scope.get("headers", []):
        if name == _REQUEST_ID:
            candidate = value.decode("latin-1")[:64]
            if candidate.isascii() and candidate.replace("-", "").isalnum():
                return candidate
    return uuid.uuid4().hex


_SCOPE_KEY = "memgate.request_id"


def request_id_of(scope: MutableMapping[str, Any]) -> str | None:
    """The id the request context middleware gave this request (echoed in `X-Request-Id`)."""
    found = scope.get(_SCOPE_KEY)
    return found if isinstance(found, str) else None


def request_context_middleware(app: ASGIApp) -> ASGIApp:
    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await app(scope, receive, send)
            return
        request_id = _incoming_request_id(scope)
        cast(MutableMapping[str, Any], scope)[_SCOPE_KEY] = request_id
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(request_id=request_id)
        started = time.perf_counter()
        status = 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = list(message.get("headers", []))
                headers.append((_REQUEST_ID, request_id.encode()))
                message["headers"] = headers
            await send(message)

        try:
            await app(scope, receive, send_with_id)
        finally:
            elapsed = time.perf_counter() - started
            route = route_of(scope)
            REQUEST_DURATION.record(
                elapsed,
                {
                    "http.route": route,
                    "http.request.method": http_method(scope),
                    "http.response.status_code": status,
                },
            )
            _access.info(
                "request",
                method=scope.get("method"),
                route=route,
                status=status,
                latency_ms=round(elapsed * 1000, 2),
            )
            structlog.contextvars.clear_contextvars()

    return middleware
