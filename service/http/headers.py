"""Response headers every answer carries, whichever part of the app produced it."""

from __future__ import annotations

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, Scope, Send

_CACHE_CONTROL = b"cache-control"
_NOSNIFF = (b"x-content-type-options", b"nosniff")
_NO_STORE = (_CACHE_CONTROL, b"no-store")
_HSTS = (b"strict-transport-security", b"max-age=31536000; includeSubDomains")


def server_answer_headers(*, hsts: bool) -> list[tuple[bytes, bytes]]:
    """The same headers for the answers uvicorn writes itself (its parser's 400s, which never
    reach the app: service/http/server.py)."""
    return [_NOSNIFF, _NO_STORE, *([_HSTS] if hsts else [])]


def security_headers(app: ASGIApp, *, hsts: bool = False) -> ASGIApp:
    """`X-Content-Type-Options: nosniff` on every answer, and `Cache-Control: no-store` on every
    answer that does not set its own: answers hold memories, policy and audit rows of one
    caller, and a shared cache (proxy, CDN, browser) must never keep one for the next. Outside
    Litestar, so 401s from authentication and 404s for unknown routes carry them too.
    `hsts` (serve terminates TLS): `Strict-Transport-Security` on every answer too; never
    over plain HTTP, where it would be meaningless (RFC 6797) and a proxy in front owns it."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                names = {bytes(name).lower() for name, _ in headers}
                headers.append(_NOSNIFF)
                if hsts:
                    headers.append(_HSTS)
                if _CACHE_CONTROL not in names:
                    headers.append(_NO_STORE)
                message["headers"] = headers
            await send(message)

        await app(scope, receive, send_with_headers)

    return middleware
