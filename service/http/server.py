"""The HTTP server (uvicorn) as memgate runs it, and what its parser refuses before the app.

A request uvicorn cannot parse (a bad request line, a bad header line, a target that is not
ASCII, headers too large) is answered 400 by the server and never reaches the ASGI app: the audit
recorder cannot see it, so it leaves no audit row. It is counted here instead
(`memgate.http.server.rejected`) and logged as one content-free line: the bytes are attacker
text, so neither the metric nor the log carries any of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog
from uvicorn.protocols.http.h11_impl import H11Protocol

from service.observability.telemetry import SERVER_REJECTED

if TYPE_CHECKING:
    import uvicorn
    from litestar import Litestar

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


def server_config(app: Litestar, *, host: str, port: int) -> uvicorn.Config:
    """The uvicorn configuration of `memgate serve` (tests start the same one on loopback)."""
    import uvicorn

    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=CountingH11Protocol,
        log_config=None,
        access_log=False,
        lifespan="on",
    )
