"""`GET /metrics`: Prometheus text exposition, on a listener of its own.

The metrics show every tenant's activity by route, so they are not served by the public API:
`memgate serve` runs this app on `MEMGATE_METRICS_HOST`:`MEMGATE_METRICS_PORT` (loopback by
default), for a scraper that can reach that address and nobody else.
"""

from __future__ import annotations

from litestar import Controller, Litestar, Response, get

from service.http.errors import handle_exception
from service.http.headers import security_headers
from service.observability.telemetry import metrics_text

PROMETHEUS_MEDIA_TYPE = "text/plain; version=0.0.4"
"""Litestar appends `; charset=utf-8` to text/* media types itself."""


class MetricsController(Controller):
    @get("/metrics", media_type=PROMETHEUS_MEDIA_TYPE)
    async def metrics(self) -> Response[str]:
        """Request, search, embedding and audit latencies and database pool use, in the Prometheus
        text format. Labels are route templates, methods, statuses and model ids, never content."""
        return Response(metrics_text().decode(), media_type=PROMETHEUS_MEDIA_TYPE)


def create_metrics_app() -> Litestar:
    """The metrics listener's app: `/metrics` and nothing else (no token, no audit rows, no
    OpenAPI document); other paths get the usual problem+json 404."""
    app = Litestar(
        route_handlers=[MetricsController],
        exception_handlers={Exception: handle_exception},
        openapi_config=None,
        debug=False,
    )
    app.asgi_handler = security_headers(app.asgi_handler)
    return app
