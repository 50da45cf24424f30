"""The HTTP listeners (uvicorn) as `memgate serve` runs them — the public API and the metrics
scrape — and what the HTTP parser refuses before the app.

A request uvicorn cannot parse (a bad request line, a bad header line, a target that is not
ASCII, headers too large) is answered 400 by the server and never reaches the ASGI app: the audit
recorder cannot see it, so it leaves no audit row. It is counted here instead
(`memgate.http.server.rejected`) and logged as one content-free line: the bytes are attacker
text, so neither the metric nor the log carries any of them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import structlog
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from service.observability.telemetry import SERVER_REJECTED

_log = structlog.get_logger("memgate.http")
SERVER = "h11"


class CountingH11Protocol(H11Protocol):
    """uvicorn's h11 protocol; every request its parser rejects is counted and logged.

    Pinned rather than uvicorn's "auto" choice: with httptools installed, auto would switch to a
    parser whose rejections this class does not see."""

    def send_400_response(self, msg: str) -> None:
        # uvicorn answers every parse failure through here (msg is its fixed text, no input).
        SERVER_REJECTED.add(1, {"memgate.http.server": SERVER})
        _log.warning("http_request_rejected_by_server", status=400, server=SERVER)
        super().send_400_response(msg)


def listener_config(app: Any, host: str, port: int) -> uvicorn.Config:
    """How every memgate listener runs (tests start the same one on loopback): our access log
    instead of uvicorn's, parser rejections counted, and no `server: uvicorn` header (naming
    the software, and so its known bugs, helps only an attacker)."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=CountingH11Protocol,
        log_config=None,
        access_log=False,
        server_header=False,
        lifespan="on",
    )


class MetricsServer(uvicorn.Server):
    """The metrics listener. It leaves the signals to the API server (two servers taking the
    same handlers would undo each other's on exit); `memgate serve` stops it after the API."""

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield
