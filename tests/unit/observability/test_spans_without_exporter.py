"""With no span exporter configured, spans are not recorded (nothing would read them), yet every
span still carries a trace id, so audit rows and logs keep naming the call's trace.

Run in a child process: the providers are process-wide and set once, and the test process
keeps its own (in-memory) configuration."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CHILD = """
from opentelemetry import trace

from service.observability import telemetry
from service.settings import ObservabilitySettings

assert telemetry.configure_telemetry(ObservabilitySettings.from_env())
with telemetry.span("probe") as outer, telemetry.span("child") as inner:
    context = inner.get_span_context()
    print(outer.is_recording(), inner.is_recording(), context.is_valid,
          context.trace_id == outer.get_span_context().trace_id)

from sqlalchemy.ext.asyncio import create_async_engine

engine = create_async_engine("postgresql+psycopg://nobody@localhost/none")
telemetry.instrument_engine(engine)
print(bool(engine.sync_engine.dispatch.before_cursor_execute))
"""


def test_spans_are_dropped_but_keep_their_trace_id() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    child = subprocess.run(  # noqa: S603 (our own interpreter)
        [sys.executable, "-c", CHILD],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    # Spans dropped, trace ids kept, and no statement listener paying for a span nobody reads.
    assert child.stdout.split() == ["False", "False", "True", "True", "False"]
