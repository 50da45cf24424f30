"""With `OTEL_EXPORTER_OTLP_ENDPOINT` set, spans and metrics are pushed by OTLP/HTTP.

Run in a child process: the providers are process-wide and set once, and the test process
keeps its own (in-memory) configuration."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
CHILD = """
from opentelemetry import metrics, trace

from service.observability import telemetry
from service.settings import ObservabilitySettings

assert telemetry.configure_telemetry(ObservabilitySettings.from_env())
with telemetry.span("otlp.probe"):
    telemetry.SEARCH_DURATION.record(0.01)
trace.get_tracer_provider().shutdown()  # flushes the batch processor
metrics.get_meter_provider().shutdown()  # exports once more on the way out
"""


class Collector(ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.received: dict[str, bytes] = {}


class _Handler(BaseHTTPRequestHandler):
    server: Collector

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        self.server.received[self.path] = self.server.received.get(self.path, b"") + body
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[Collector]:
    server = Collector()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_spans_and_metrics_go_to_the_otlp_endpoint(collector: Collector) -> None:
    host, port = collector.server_address[:2]
    env = os.environ | {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{host!s}:{port}",
        "OTEL_SERVICE_NAME": "memgate-otlp-test",
    }
    subprocess.run(  # noqa: S603 (our own interpreter and code)
        [sys.executable, "-c", CHILD], cwd=ROOT, env=env, check=True, timeout=60
    )
    assert set(collector.received) == {"/v1/traces", "/v1/metrics"}
    assert b"otlp.probe" in collector.received["/v1/traces"]
    assert b"memgate-otlp-test" in collector.received["/v1/traces"]
    assert b"memgate.search.duration" in collector.received["/v1/metrics"]
