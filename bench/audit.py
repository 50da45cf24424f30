"""What the audit log costs a write and a search: the same requests through the real app and
through a twin that ends the request transaction the same way but appends no audit row.

    .venv/bin/python -m bench.audit [--memories 2000] [--requests 300]

Requests alternate between the two apps (same process, same database, same agent), so drift of
a shared, noisy machine hits both sides alike. Prints medians, the overhead in milliseconds and
as a ratio, and the median of the append call itself (the `audit_append()` round trip inside
the request's transaction).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import MutableMapping
from typing import Any, cast

import httpx
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from bench.api import (
    PUBLIC_URL,
    agent_credentials,
    bearer,
    bench_main,
    new_runtime,
    search_body,
    write_body,
)
from service.app import create_app
from service.audit import rows
from service.calls import Call
from service.http.audit import attach_call
from service.observability.logging import request_context_middleware
from service.observability.telemetry import otel_asgi
from service.runtime import Runtime


def unaudited(app: ASGIApp, runtime: Runtime) -> ASGIApp:
    """The call's transaction handling without the audit row: the baseline."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        call = Call(runtime, "bench.unaudited", "POST", "unaudited")
        attach_call(cast(MutableMapping[str, Any], scope), call)

        async def send_after_commit(message: Message) -> None:
            session = call.db
            if message["type"] == "http.response.start" and session.in_transaction():
                if message["status"] < 400:
                    await session.commit()
                else:
                    await session.rollback()
            await send(message)

        try:
            await app(scope, receive, send_after_commit)
        finally:
            await call.close()

    return middleware


def baseline_app(runtime: Runtime) -> ASGIApp:
    app = create_app(runtime)
    inner = app._create_asgi_handler()  # the router, not yet wrapped by the call adapter
    app.asgi_handler = otel_asgi(request_context_middleware(unaudited(inner, runtime)))
    return cast(ASGIApp, app)


class AppendTimer:
    """Times every `append()` a call makes (the bench's own wrapper, not a stub: the
    real function runs)."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._real = rows.append

    async def __call__(self, *args: Any, **kwargs: Any) -> tuple[int, bytes]:
        started = time.perf_counter()
        try:
            appended: tuple[int, bytes] = await self._real(*args, **kwargs)
            return appended
        finally:
            self.samples.append((time.perf_counter() - started) * 1000)

    def install(self) -> None:
        rows.append = self


async def _one(client: httpx.AsyncClient, path: str, body: dict[str, Any], headers: Any) -> float:
    started = time.perf_counter()
    response = await client.post(path, json=body, headers=headers)
    elapsed = (time.perf_counter() - started) * 1000
    assert response.status_code < 300, response.text
    return elapsed


def _report(name: str, audited: list[float], plain: list[float], appends: list[float]) -> None:
    a, b = statistics.median(audited), statistics.median(plain)
    print(
        f"{name:<8} audited p50 {a:6.2f} ms | without audit p50 {b:6.2f} ms | "
        f"overhead {a - b:+5.2f} ms ({a / b:.2f}x) | audit_append() p50 "
        f"{statistics.median(appends):5.2f} ms  (n={len(audited)})"
    )


async def run(url: str, memories: int, requests: int) -> None:
    runtime = await new_runtime(url)
    timer = AppendTimer()
    timer.install()
    audited_app, plain_app = create_app(runtime), baseline_app(runtime)
    audited = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=cast(Any, audited_app)), base_url=PUBLIC_URL
    )
    plain = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=cast(Any, plain_app)), base_url=PUBLIC_URL
    )
    async with audited, plain:
        agent = await bearer(audited, await agent_credentials(audited, runtime))
        for i in range(memories):  # fill the agent's space
            await _one(audited, "/v1/memories", write_body(i), agent)
        for name, path, body in (
            ("write", "/v1/memories", lambda i: write_body(memories + i)),
            ("search", "/v1/memories/search", search_body),
        ):
            with_audit: list[float] = []
            without: list[float] = []
            timer.samples.clear()
            for i in range(requests):
                # Alternate which side goes first so neither always meets a warmer cache.
                pair = [(audited, with_audit), (plain, without)]
                for client, samples in pair if i % 2 else pair[::-1]:
                    n = 2 * i + (client is plain)
                    samples.append(await _one(client, path, body(n), agent))
            _report(name, with_audit, without, list(timer.samples))
    await runtime.close()


def main() -> None:
    bench_main(run, __doc__)


if __name__ == "__main__":
    main()
