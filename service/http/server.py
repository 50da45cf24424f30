"""The HTTP listeners (uvicorn) as `memgate serve` runs them — the public API and the metrics
scrape — and what the HTTP parser refuses before the app.

A request uvicorn cannot parse (a bad request line, a bad header line, a target that is not
ASCII, headers too large) is answered 400 by the server and never reaches the ASGI app: the audit
recorder cannot see it, so it leaves no audit row. It is counted here instead
(`memgate.http.server.rejected`, labelled with the parser) and logged as one content-free line:
the bytes are attacker text, so neither the metric nor the log carries any of them.

Both of uvicorn's HTTP/1.1 protocols answer every parse failure through `send_400_response`, so
one override per protocol counts them all: httptools (the default, C) and h11 (pure Python,
`MEMGATE_HTTP_PARSER=h11`). The override also writes the answer itself, with the headers every
answer of the app carries (`nosniff`, `no-store`, and HSTS over TLS: service/http/headers.py),
which uvicorn's own 400 lacked. The event loop is uvloop.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, TypeVar

import structlog
import uvicorn
import uvloop
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service.http.headers import server_answer_headers
from service.observability.telemetry import SERVER_REJECTED

T = TypeVar("T")
_log = structlog.get_logger("memgate.http")
MAX_HEAD_BYTES = 16 * 1024
"""h11's default bound on an incomplete head (its receive buffer); httptools gets the same."""
BACKLOG = 2048
"""uvicorn's default listen backlog, also for the socket `serve --workers` binds itself."""


def _count_rejection(server: str) -> None:
    # Called with uvicorn's fixed message only; nothing of the request is passed on.
    SERVER_REJECTED.add(1, {"memgate.http.server": server})
    _log.warning("http_request_rejected_by_server", status=400, server=server)


def _refuse(protocol: H11Protocol | HttpToolsProtocol, msg: str) -> None:
    """Answer 400 with `msg` (uvicorn's fixed text) and close, as uvicorn does, plus the
    server's default headers (`date`) and the security headers of every answer."""
    body = msg.encode("ascii")
    headers = [
        *protocol.server_state.default_headers,
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"content-length", str(len(body)).encode("ascii")),
        (b"connection", b"close"),
        *server_answer_headers(hsts=protocol.config.is_ssl),
    ]
    head = b"".join(name + b": " + value + b"\r\n" for name, value in headers)
    protocol.transport.write(b"HTTP/1.1 400 Bad Request\r\n" + head + b"\r\n" + body)
    protocol.transport.close()


class CountingH11Protocol(H11Protocol):
    """uvicorn's h11 protocol; every request its parser rejects is counted and logged."""

    def send_400_response(self, msg: str) -> None:
        # uvicorn answers every h11 RemoteProtocolError through here.
        _count_rejection("h11")
        _refuse(self, msg)


class CountingHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol; every request its parser rejects is counted and logged,
    and a head still incomplete beyond MAX_HEAD_BYTES is refused as h11 refuses it (httptools
    buffers a head without bound: a header line that never ends grew the process's memory)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_body = False
        self._head_bytes = 0
        """Bytes received since the last message boundary while the head was incomplete."""
        self._boundaries = 0

    def data_received(self, data: bytes) -> None:
        boundaries, in_head = self._boundaries, not self._in_body
        super().data_received(data)
        if self._boundaries != boundaries:
            self._head_bytes = 0  # a head completed in this chunk (or a message ended)
        elif in_head and not self._in_body and not self.transport.is_closing():
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self.send_400_response("Request head too large.")

    def on_headers_complete(self) -> None:
        self._in_body, self._boundaries = True, self._boundaries + 1
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._in_body, self._boundaries = False, self._boundaries + 1
        super().on_message_complete()

    def send_400_response(self, msg: str) -> None:
        # uvicorn answers every HttpParserError here, including an exception raised by its own
        # callbacks while parsing (a non-ASCII target fails to decode in on_headers_complete,
        # which httptools raises as HttpParserCallbackError, an HttpParserError).
        _count_rejection("httptools")
        _refuse(self, msg)


PROTOCOLS: dict[str, type[H11Protocol] | type[HttpToolsProtocol]] = {
    "httptools": CountingHttpToolsProtocol,
    "h11": CountingH11Protocol,
}
"""Pinned rather than uvicorn's "auto" choice, which would pick a parser nothing counts."""


def listener_config(
    app: Any,
    host: str,
    port: int,
    *,
    parser: str = "httptools",
    tls_cert_file: str = "",
    tls_key_file: str = "",
) -> uvicorn.Config:
    """How every memgate listener runs (tests start the same one on loopback): uvloop, our access
    log instead of uvicorn's, parser rejections counted, and no `server: uvicorn` header (naming
    the software, and so its known bugs, helps only an attacker). With certificate files it
    terminates TLS (uvicorn's defaults: TLS 1.2 and later, the ssl module's ciphers), also on a
    socket bound beforehand (`serve --workers N`)."""
    return uvicorn.Config(
        app,
        ssl_certfile=tls_cert_file or None,
        ssl_keyfile=tls_key_file or None,
        host=host,
        port=port,
        loop="uvloop",
        http=PROTOCOLS[parser],
        log_config=None,
        access_log=False,
        server_header=False,
        lifespan="on",
        backlog=BACKLOG,
    )


def run_on_uvloop(main: Coroutine[Any, Any, T]) -> T:
    """Run `serve`'s coroutine on uvloop. `Config(loop="uvloop")` alone takes effect only in
    `uvicorn.run`/`Server.run`, which make their own loop; `serve` runs its own."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)


def bind(host: str, port: int) -> socket.socket:
    """The public socket `serve --workers N` binds once, before any worker starts: a port that
    is taken fails here, in the parent, and every worker accepts on the same socket (no
    SO_REUSEPORT, so no other process of this user can bind the port alongside them)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
        sock.set_inheritable(True)
    except OSError:
        sock.close()
        raise
    return sock


class MetricsServer(uvicorn.Server):
    """The metrics listener. It leaves the signals to the API server (two servers taking the
    same handlers would undo each other's on exit); `memgate serve` stops it after the API."""

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class WorkerServer(uvicorn.Server):
    """A worker's API server. Its parent stops it with SIGTERM, and a Ctrl-C at the terminal
    reaches it too (the whole process group gets SIGINT): two signals, in either order, that
    uvicorn would read as "a second Ctrl-C, exit now" when SIGINT comes second. That skips the
    app's lifespan shutdown, whose task is then cancelled and logged as an error. A worker
    always stops gracefully; the parent kills one that is still up after `STOP_SECONDS`."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        self.force_exit = False
