"""The `/mcp` route: the SDK's ASGI app mounted in the Litestar app, bound to `mcp.exchange`.

Being a route of the app, it goes through everything a REST route does before it: the trace
span, the request id, the HTTP call, and the bearer authentication (no valid token → the same
401 with `WWW-Authenticate` naming the protected-resource metadata).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from litestar import Litestar, asgi
from litestar.handlers import ASGIRouteHandler
from litestar.types import Receive, Scope, Send

from service.http.routes import route
from service.mcp import operations as ops
from service.mcp.server import ROUTE, McpEndpoint
from service.runtime import Runtime


def mcp_routes(
    runtime: Runtime | None,
) -> tuple[ASGIRouteHandler, Callable[[Litestar], AbstractAsyncContextManager[None]]]:
    """The `/mcp` route handler of one app and the lifespan that runs its session manager (one
    per app: the SDK's manager runs once)."""
    endpoint = McpEndpoint(runtime)

    @asgi(ROUTE, is_mount=True, copy_scope=True, **route(ops.EXCHANGE))
    async def mcp(scope: Scope, receive: Receive, send: Send) -> None:
        """MCP over streamable HTTP (stateless, JSON responses): the memory tools."""
        await endpoint.handle(scope, receive, send)

    @asynccontextmanager
    async def lifespan(_: Litestar) -> AsyncIterator[None]:
        async with endpoint.running():
            yield

    return mcp, lifespan
