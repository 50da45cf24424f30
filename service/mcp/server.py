"""The MCP server behind `/mcp`: the official SDK's streamable HTTP transport, stateless, with
JSON responses, over the tools of service/mcp/tools.py.

Authentication happened before this runs: `/mcp` is a route of the app, so the bearer token
was verified by the same middleware as REST, and the HTTP call on the ASGI scope names the
caller. A tool call finds that call through the SDK's request context (the Starlette request
holds the scope) and opens a call of its own for the tool's operation (`open_call`): scope
check, the operation's policy check, strict arguments, the service, then the audit row in the
same transaction and the commit — all before the tool result exists, so JSON responses cannot
run ahead of the commit. The HTTP exchange's own row is dropped when the tool call left one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, MutableMapping
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import msgspec
import structlog
from mcp.server.context import CallNext, HandlerResult, ServerMiddleware, ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INVALID_PARAMS,
    CallToolRequestParams,
    CallToolResult,
    ListToolsResult,
    PaginatedRequestParams,
    TextContent,
    ToolAnnotations,
)
from mcp_types import Tool as WireTool
from opentelemetry import context as otel_context

from service.auth.scopes import insufficient_scope
from service.calls import Call, open_call
from service.http.audit import find_call, send_problem
from service.mcp.arguments import decode
from service.mcp.tools import IDEMPOTENCY_KEY, TOOLS, Tool, check_every_tool_is_an_operation
from service.memory import idempotency
from service.observability.logging import request_id_of
from service.observability.telemetry import span
from service.problems import BodyTooLarge, InternalError, Problem
from service.runtime import Runtime
from service.settings import ServerSettings

ROUTE = "/mcp"
_CONTEXT = "memgate.mcp.context"
_log = structlog.get_logger("memgate.mcp")

INSTRUCTIONS = (
    "memgate keeps typed memories for agents. `remember` writes one (a new value for the same "
    "subject, kind and key supersedes the old), `recall` ranks the ones you can see by "
    "similarity, `get_memory`, `list_memories` and `count_memories` read, `forget` deletes. "
    "A failed call says what was wrong and how to fix it; nothing was changed by it."
)


def _wire_tool(tool: Tool) -> WireTool:
    return WireTool(
        name=tool.name,
        title=tool.operation.summary,
        description=tool.description,
        input_schema=tool.input_schema(),
        annotations=ToolAnnotations(
            read_only_hint=tool.read_only,
            destructive_hint=tool.destructive,
            open_world_hint=False,
        ),
    )


def _text(value: str) -> list[Any]:
    return [TextContent(type="text", text=value)]


def result_of(value: msgspec.Struct | dict[str, Any]) -> CallToolResult:
    """The same JSON REST answers, as text (what every client shows the model) and as
    structured content."""
    return CallToolResult(
        content=_text(msgspec.json.encode(value).decode()),
        structured_content=msgspec.to_builtins(value),
    )


def refusal_of(problem: Problem) -> CallToolResult:
    """A tool error a model can act on: the problem's title, status and detail (which says
    what to change), and REST's problem body as structured content. Never a traceback."""
    text = f"{problem.title} ({problem.status} {problem.slug}): {problem.detail}"
    return CallToolResult(
        content=_text(text), structured_content=problem.to_body(instance=ROUTE), is_error=True
    )


_NO_STREAM = (
    b'{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"This server is stateless: '
    b'no GET stream. POST each JSON-RPC message to /mcp."}}'
)


async def _no_stream(send: Any) -> None:
    """405 for `GET /mcp`, as the streamable HTTP transport allows a server without a stream."""
    await send(
        {
            "type": "http.response.start",
            "status": 405,
            "headers": [
                (b"allow", b"POST"),
                (b"content-type", b"application/json"),
                (b"content-length", str(len(_NO_STREAM)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": _NO_STREAM})


class _TooLarge(Exception):
    """The body passed the limit while it was read (no Content-Length told it before)."""


def _declared_length(scope: MutableMapping[str, Any]) -> int:
    """The request's Content-Length, 0 when it has none (or one that is not a number: the
    server's parser refuses those before the app)."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            return int(value) if value.isdigit() else 0
    return 0


def carry_context(scope: MutableMapping[str, Any]) -> None:
    """Keep the request's trace and log context on its scope: the SDK runs a stateless
    request's handlers in a task of its own, started outside the request."""
    scope[_CONTEXT] = (otel_context.get_current(), structlog.contextvars.get_contextvars())


@contextmanager
def _request_context(scope: MutableMapping[str, Any] | None) -> Iterator[None]:
    carried = scope.get(_CONTEXT) if scope is not None else None
    if carried is None:
        yield
        return
    trace_context, log_context = carried
    token = otel_context.attach(trace_context)
    try:
        with structlog.contextvars.bound_contextvars(**log_context):
            yield
    finally:
        otel_context.detach(token)


_HANDSHAKE = frozenset({"initialize", "notifications/initialized", "notifications/cancelled"})


def traced(server: Server[Any]) -> ServerMiddleware[Any]:
    """Each MCP message under the request's trace (and log context), as `mcp <method>`, with
    the tool's name when it is one of ours. In place of the SDK's own span middleware, which
    names its span after whatever tool name the caller sent; a method we do not serve is
    `mcp other`, for the same reason."""

    def known(method: str) -> bool:
        return method in _HANDSHAKE or server.get_request_handler(method) is not None

    async def middleware(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        method = ctx.method if known(ctx.method) else "other"
        attributes = {"mcp.method.name": method}
        name = ctx.params.get("name") if ctx.params else None
        if method == "tools/call" and isinstance(name, str) and name in TOOLS:
            attributes["mcp.tool.name"] = name
        with (
            _request_context(getattr(ctx.request, "scope", None)),
            span(f"mcp {method}", attributes),
        ):
            return await call_next(ctx)

    return middleware


async def _invoke(tool: Tool, call: Call, runtime: Runtime, arguments: Any) -> Any:
    """What REST's guards, strict body, idempotency hooks and handler do, in the same order."""
    operation, caller = tool.operation, call.caller
    assert caller is not None
    if operation.scope is not None and not caller.has_scope(operation.scope):
        raise insufficient_scope(caller, operation.scope)
    if operation.check is not None:
        await operation.check(call)
    given = dict(arguments or {})
    raw_key = given.pop(IDEMPOTENCY_KEY, None) if operation.idempotent else None
    data = decode(given, tool.arguments)
    if raw_key is None:
        return await tool.run(call, runtime, data)
    return await _keyed(tool, call, runtime, data, given, raw_key)


async def _keyed(
    tool: Tool, call: Call, runtime: Runtime, data: Any, given: dict[str, Any], raw_key: Any
) -> Any:
    """A tool call under an `idempotency_key` (service/memory/idempotency.py): the stored
    answer of the same call again, or the tool's answer, kept under the key."""
    caller = call.caller
    assert caller is not None
    if not isinstance(raw_key, str):
        raw_key = ""  # refused by the key's own check, in its words
    identity = idempotency.request_identity(
        tool.operation.name, f"mcp {tool.name}", "", msgspec.json.encode(given)
    )
    key = idempotency.key_of(caller, raw_key, identity)
    replay = await idempotency.claim(call.db, caller, call.facts, key)
    if replay is not None:
        return msgspec.json.decode(replay.body) if replay.body else {}
    value = await tool.run(call, runtime, data)
    await idempotency.settle(call.db, key, tool.operation.success, value)
    return value


_REFUSALS = {
    # JSON-RPC error code → the status REST answers for the same refusal, and the row's reason.
    -32700: (400, "mcp-parse-error"),
    -32600: (400, "mcp-invalid-request"),
    -32601: (404, "mcp-method-not-found"),
    -32602: (422, "mcp-invalid-params"),
}


def _note_refusal(exchange: Call, message: MutableMapping[str, Any]) -> None:
    """A JSON-RPC error travels in a 200 answer; the exchange's audit row records the refusal
    (a tool's own refusals are results of its call, audited there with their status)."""
    body = message.get("body", b"")
    if message.get("more_body") or b'"error"' not in body:
        return
    try:
        answer = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return
    error = answer.get("error") if isinstance(answer, dict) else None
    if isinstance(error, dict):
        code = error.get("code")
        known = _REFUSALS.get(code) if isinstance(code, int) else None
        exchange.facts.refuse(*(known or (500, "mcp-internal-error")))


class McpEndpoint:
    """One per app: the SDK server, its session manager (whose task group runs while the app
    does) and the ASGI entry the `/mcp` route calls."""

    def __init__(self, runtime: Runtime | None) -> None:
        check_every_tool_is_an_operation()
        self.runtime = runtime
        self.server: Server[Any] = Server(
            "memgate",
            version="0.1.0",
            instructions=INSTRUCTIONS,
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
        )
        self.server.middleware = [traced(self.server)]
        limit = runtime.settings.server.max_body_bytes if runtime else ServerSettings.max_body_bytes
        self._max_body_bytes = limit
        # Stateless: every POST stands alone (any replica can serve it, nothing to expire).
        # JSON responses: the answer is written once the handler returned, i.e. after the
        # tool's call committed; no SSE stream that could start before it.
        self.manager = StreamableHTTPSessionManager(
            self.server, json_response=True, stateless=True, max_request_body_size=limit
        )

    async def handle(self, scope: Any, receive: Any, send: Any) -> None:
        if scope.get("method") == "GET":
            # The standalone SSE stream: a stateless server never has anything to send on it,
            # and it would hold the connection open for as long as the client likes.
            await _no_stream(send)
            return
        carry_context(scope)
        exchange = find_call(scope)
        if _declared_length(scope) > self._max_body_bytes:
            # Refused from the head, before a byte of the body is read, as REST does; the SDK
            # would read up to the limit first and answer in plain text.
            await self._refuse_too_large(scope, send, exchange)
            return
        received = 0

        async def counted() -> Any:
            # A body without a Content-Length (chunked) is counted as it comes, and refused as
            # soon as it passes the limit, before the SDK's own plain-text limit answers.
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self._max_body_bytes:
                raise _TooLarge
            return message

        held: list[MutableMapping[str, Any]] = []

        async def audited(message: MutableMapping[str, Any]) -> None:
            # The SDK answers with `HTTPStatus` members; the log and the audit row want numbers.
            if message["type"] == "http.response.start":
                message["status"] = int(message["status"])
                held.append(message)  # the row is written at the start: read the body first
                return
            if held:
                start = held.pop()
                if exchange is not None and start["status"] < 400:
                    _note_refusal(exchange, message)
                await send(start)
            await send(message)

        too_large = False
        try:
            await self.manager.handle_request(scope, counted, audited)
        except* _TooLarge:
            too_large = True
        if too_large:
            await self._refuse_too_large(scope, send, exchange)
        elif held:
            await send(held.pop())

    async def _refuse_too_large(self, scope: Any, send: Any, exchange: Call | None) -> None:
        too_large = BodyTooLarge(
            f"The request body is larger than the server accepts ({self._max_body_bytes} "
            "bytes). Send smaller tool arguments: long texts as several memories."
        )
        if exchange is not None:
            exchange.facts.reason = too_large.audit_reason()
        await send_problem(send, too_large, scope.get("path", "/mcp"))

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        async with self.manager.run():
            yield

    async def _list_tools(
        self, _: ServerRequestContext[Any, Any], __: PaginatedRequestParams | None
    ) -> ListToolsResult:
        return ListToolsResult(tools=[_wire_tool(tool) for tool in TOOLS.values()])

    async def _call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: CallToolRequestParams
    ) -> CallToolResult:
        tool = TOOLS.get(params.name)
        if tool is None:
            # A protocol error (the spec's answer to an unknown tool), audited with the exchange.
            raise MCPError(
                INVALID_PARAMS, f"No tool named {params.name[:64]!r}; tools/list names the tools."
            )
        scope = getattr(ctx.request, "scope", None)
        exchange = find_call(scope) if scope is not None else None
        if scope is None or exchange is None or not exchange.authenticated or not self.runtime:
            _log.error("mcp_tool_without_caller", tool=tool.name)
            return refusal_of(InternalError("Something failed on our side; it was logged."))
        return await self._run(tool, exchange, scope, params.arguments)

    async def _run(
        self, tool: Tool, exchange: Call, scope: MutableMapping[str, Any], arguments: Any
    ) -> CallToolResult:
        assert self.runtime is not None
        assert exchange.caller is not None
        assert exchange.token is not None
        opened: list[Call] = []
        # The exchange only authenticated: its connection goes back before the tool takes one.
        await exchange.release()
        try:
            async with open_call(
                self.runtime,
                tool.operation,
                caller=exchange.caller,
                token=exchange.token,
                method="POST",
                route=ROUTE,
                request_id=request_id_of(scope),
            ) as call:
                opened.append(call)
                value = await _invoke(tool, call, self.runtime, arguments)
        except Problem as problem:
            answer = refusal_of(problem)
        except Exception as exc:
            # Recorded by the call as a 500; the caller learns nothing of what failed.
            _log.error("mcp_tool_failed", tool=tool.name, error_type=type(exc).__name__)
            answer = refusal_of(InternalError("Something failed on our side; it was logged."))
        else:
            answer = result_of(value)
        if opened and opened[0].receipt is not None:
            # The tool call's row stands for this exchange: one row per tool call, not two.
            exchange.exempt = True
        return answer
