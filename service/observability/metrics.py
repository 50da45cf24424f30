"""`GET /metrics`: Prometheus text exposition, for scrapers (no token)."""

from __future__ import annotations

from litestar import Controller, Response, get

from service.observability.telemetry import metrics_text

PROMETHEUS_MEDIA_TYPE = "text/plain; version=0.0.4"
"""Litestar appends `; charset=utf-8` to text/* media types itself."""


class MetricsController(Controller):
    tags = ["operations"]

    @get(
        "/metrics",
        summary="Prometheus metrics",
        media_type=PROMETHEUS_MEDIA_TYPE,
        include_in_schema=True,
        opt={"exclude_from_auth": True, "audit_exempt": True},
    )
    async def metrics(self) -> Response[str]:
        """Request, search, embedding and audit latencies and database pool use, in the Prometheus
        text format. Labels are route templates, methods, statuses and model ids, never content."""
        return Response(metrics_text().decode(), media_type=PROMETHEUS_MEDIA_TYPE)
