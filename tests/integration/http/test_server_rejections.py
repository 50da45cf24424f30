"""Review item 23: requests the HTTP server's parser refuses never reach the app, so they leave
no audit row. They are counted (a metric) and logged without content, through a real uvicorn
on loopback spoken to with a raw socket, under both parsers `serve` can run (httptools, the
default, and h11)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import pytest
from litestar.testing import AsyncTestClient
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.app import create_app
from service.http.server import PROTOCOLS, listener_config
from service.http.tls import self_signed
from service.observability.metrics import create_metrics_app
from service.runtime import Runtime
from service.settings import Settings
from tests.fixtures.canaries import captured_logs

CANARY = "c4nary-7f3e9a"
REJECTED = "memgate_http_server_rejected_total"
MALFORMED = [
    # a header line without a colon
    f"GET /v1/memories HTTP/1.1\r\nHost: 127.0.0.1\r\n{CANARY} header\r\n\r\n".encode(),
    # a request line that is not one
    f"{CANARY} /v1/memories\r\nHost: 127.0.0.1\r\n\r\n".encode(),
    # a path that is not UTF-8 (nor ASCII)
    b"GET /v1/memories/\xff\xfe" + CANARY.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
]


@dataclass(frozen=True)
class Listener:
    port: int
    parser: str


HSTS = b"strict-transport-security: max-age=31536000; includeSubDomains\r\n"


@pytest.fixture(params=sorted(PROTOCOLS))
async def server(
    runtime: Runtime, settings: Settings, request: pytest.FixtureRequest
) -> AsyncIterator[Listener]:
    async for listener in _listening(runtime, request.param):
        yield listener


async def _listening(runtime: Runtime, parser: str, **tls: str) -> AsyncIterator[Listener]:
    import uvicorn

    config = listener_config(create_app(runtime), "127.0.0.1", 0, parser=parser, **tls)
    served = uvicorn.Server(config)
    task = asyncio.create_task(served.serve())
    for _ in range(200):  # bounded: 10 s
        if served.started or task.done():
            break
        await asyncio.sleep(0.05)
    assert served.started, "uvicorn did not start"
    port = int(served.servers[0].sockets[0].getsockname()[1])
    try:
        yield Listener(port, parser)
    finally:
        served.should_exit = True
        await asyncio.wait_for(task, 10)


async def _raw(port: int, request: bytes, tls: ssl.SSLContext | None = None) -> bytes:
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=tls, server_hostname="127.0.0.1" if tls else None
    )
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.read(65536), 5)
    finally:
        writer.close()


def _rejected(metrics: str) -> float:
    return sum(
        sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name == REJECTED
    )


async def _audit_rows(owner: AsyncEngine) -> int:
    async with owner.connect() as conn:
        return int(await conn.scalar(text("SELECT count(*) FROM audit_events")) or 0)


async def _metrics() -> str:
    """The scrape, from the metrics listener's app (the process-wide registry the server's
    protocol counts into; the public listener serves no /metrics)."""
    async with AsyncTestClient(app=create_metrics_app()) as http:
        answer = await http.get("/metrics")
    assert answer.status_code == 200, answer.text
    return answer.text


async def test_parser_rejections_are_counted_and_logged_without_content(
    server: Listener, owner_engine: AsyncEngine, span_exporter: InMemorySpanExporter
) -> None:
    before = _rejected(await _metrics())
    rows_before = await _audit_rows(owner_engine)
    with captured_logs() as events:
        for request in MALFORMED:
            answer = await _raw(server.port, request)
            assert answer.startswith(b"HTTP/1.1 400"), answer
    assert _rejected(await _metrics()) == before + len(MALFORMED)
    # They never reached the app: no audit row (that is the limit docs/audit.md states).
    assert await _audit_rows(owner_engine) == rows_before
    rejected = [e for e in events if e.get("event") == "http_request_rejected_by_server"]
    assert len(rejected) == len(MALFORMED)
    assert CANARY not in repr(events)
    assert all(set(e) <= {"event", "log_level", "status", "server"} for e in rejected), rejected
    assert {e["server"] for e in rejected} == {server.parser}


async def test_a_well_formed_request_is_not_counted(
    server: Listener, span_exporter: InMemorySpanExporter
) -> None:
    before = _rejected(await _metrics())
    answer = await _raw(
        server.port, b"GET /v1/memories HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    assert answer.startswith(b"HTTP/1.1 401"), answer
    assert _rejected(await _metrics()) == before


async def test_a_head_that_never_ends_is_refused_and_counted(
    server: Listener, span_exporter: InMemorySpanExporter
) -> None:
    """A header line that keeps growing (sent in pieces, never ended) is cut off at the head
    limit and counted, under either parser: httptools itself buffers a head without bound."""
    before = _rejected(await _metrics())
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(f"GET /v1/memories HTTP/1.1\r\nHost: 127.0.0.1\r\nX-{CANARY}: ".encode())
        answer = b""
        for _ in range(64):  # bounded: 64 x 4 KiB, far above the limit
            writer.write(b"a" * 4096)
            await writer.drain()
            await asyncio.sleep(0.005)
            with suppress(TimeoutError):
                answer = await asyncio.wait_for(reader.read(65536), 0.01)
            if answer:
                break
        if not answer:
            answer = await asyncio.wait_for(reader.read(65536), 5)
    except ConnectionResetError:
        answer = b"(reset)"
    finally:
        writer.close()
    assert answer.startswith(b"HTTP/1.1 400"), answer
    assert _rejected(await _metrics()) == before + 1


@pytest.mark.parametrize("parser", sorted(PROTOCOLS))
async def test_a_parser_rejection_over_tls_carries_the_headers_of_every_answer(
    runtime: Runtime, tmp_path: Path, parser: str, span_exporter: InMemorySpanExporter
) -> None:
    """uvicorn's own 400 (a bad header line, a Content-Length that is no number) never reaches
    the app, and went out over HTTPS without HSTS, nosniff or no-store."""
    made = self_signed(tmp_path, ["127.0.0.1"])
    trust = ssl.create_default_context(cafile=str(made.cert_file))
    files = {"tls_cert_file": str(made.cert_file), "tls_key_file": str(made.key_file)}
    bad = [
        MALFORMED[0],
        b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: x\r\n\r\n",
    ]
    async for listener in _listening(runtime, parser, **files):
        for request in bad:
            answer = await _raw(listener.port, request, trust)
            head = answer.split(b"\r\n\r\n", 1)[0] + b"\r\n"
            assert head.startswith(b"HTTP/1.1 400 Bad Request\r\n"), answer
            assert HSTS in head
            assert b"x-content-type-options: nosniff\r\n" in head
            assert b"cache-control: no-store\r\n" in head
            assert CANARY.encode() not in answer
        ok = await _raw(listener.port, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", trust)
        assert ok.startswith(b"HTTP/1.1 200"), ok
    async for listener in _listening(runtime, parser):  # plain HTTP: no HSTS (RFC 6797)
        answer = await _raw(listener.port, MALFORMED[0])
        assert answer.startswith(b"HTTP/1.1 400"), answer
        assert HSTS not in answer
        assert b"x-content-type-options: nosniff\r\n" in answer
