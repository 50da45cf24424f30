"""The uvicorn listeners of `memgate serve`: the public API and the metrics scrape."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn


def listener_config(app: Any, host: str, port: int) -> uvicorn.Config:
    """How every memgate listener runs: our access log instead of uvicorn's, and no
    `server: uvicorn` header (naming the software, and so its known bugs, helps only an
    attacker)."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_config=None,
        access_log=False,
        server_header=False,
        lifespan="on",
    )


def public_server(config: uvicorn.Config) -> uvicorn.Server:
    """The API listener; it owns SIGINT/SIGTERM (Ctrl-C stops it, then the rest)."""
    return uvicorn.Server(config)


class MetricsServer(uvicorn.Server):
    """The metrics listener. It leaves the signals to the API server (two servers taking the
    same handlers would undo each other's on exit); `memgate serve` stops it after the API."""

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield
