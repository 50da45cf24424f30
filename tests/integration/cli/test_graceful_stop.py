"""SIGTERM (issue 18): a stopping `memgate serve` finishes the request in flight, refuses new
connections at once instead of leaving them queued on a socket nobody accepts from, and exits
within its grace period. A real serve with its default workers, on loopback."""

from __future__ import annotations

import json
import os
import signal
import socket
import time

import httpx

from tests.integration.cli.test_embedded_lifecycle import Server, server
from tests.integration.cli.test_serve_workers import _all_workers_up

__all__ = ["server"]  # the fixture, used by name

GRACE_SECONDS = 30.0
"""What a worker gets to drain (service/http/workers.py STOP_SECONDS), as the chart's pods do."""
REFUSED_WITHIN = 5.0


def _refused_at_once(url: str) -> bool:
    """A new call is refused (not answered, not left waiting): the port is closed."""
    try:
        httpx.get(f"{url}/healthz", timeout=1.0)
    except (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError):
        return True  # refused, or reset: queued in the moment the last socket closed
    except httpx.TimeoutException:
        return False  # queued on a listening socket that no worker accepts from any more
    return False  # still answered: not stopping yet


def _response_of(sock: socket.socket) -> tuple[int, dict[str, object]]:
    raw = b""
    sock.settimeout(10)
    while chunk := sock.recv(65536):
        raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body)


def test_sigterm_finishes_the_call_in_flight_refuses_new_ones_and_exits(server: Server) -> None:
    server.start()
    _all_workers_up(server)
    token = server.run("token").stdout.strip()
    body = json.dumps(
        {
            "subject": "service:drain",
            "kind": "fact",
            "key": "in.flight",
            "value": "sent before the SIGTERM, finished after it",
            "new_key": True,
        }
    ).encode()
    head = (
        f"POST /v1/memories HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
        f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    in_flight = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    try:
        in_flight.sendall(head + body[:10])  # the call has begun: its body is still coming
        time.sleep(1.0)  # the worker has read the head (a busy CI box is slow to)
        assert server.process is not None
        os.kill(server.process.pid, signal.SIGTERM)
        stopped_at = time.monotonic()
        while not _refused_at_once(server.url):
            assert time.monotonic() - stopped_at < REFUSED_WITHIN, "new calls still accepted"
        in_flight.sendall(body[10:])
        status, answer = _response_of(in_flight)
    finally:
        in_flight.close()
    assert status == 201, answer
    assert server.wait() == 0
    assert time.monotonic() - stopped_at < GRACE_SECONDS
    output = server.output.read_text()
    assert "Traceback" not in output, output
    assert "worker_killed" not in output, output
    # The finished call is kept.
    server.start()
    token = server.run("token").stdout.strip()
    memory = answer["memory"]
    assert isinstance(memory, dict)
    kept = httpx.get(
        f"{server.url}/v1/memories/{memory['id']}",
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )
    assert kept.status_code == 200, kept.text
    assert kept.json()["value"] == "sent before the SIGTERM, finished after it"
