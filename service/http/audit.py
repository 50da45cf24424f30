"""HTTP's adapter to the call: one `Call` per request, finished when the response starts.

When the response starts its status is known and nothing is sent yet, so the call can still
be recorded (service/calls.py): a success commits with its audit row; anything else is rolled
back and audited on its own; a call that cannot be recorded is answered 503 instead. Only
routes whose operation is marked exempt (liveness, readiness) leave no row. The app refuses to
start with a route that is not an operation.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any, Protocol, cast

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from service.audit.rows import PLATFORM_TENANT
from service.calls import Call
from service.observability.logging import request_id_of
from service.observability.telemetry import http_method, route_of
from service.operations import Operation
from service.problems import Problem, ServiceUnavailable

if TYPE_CHECKING:
    from service.runtime import Runtime

_SCOPE_KEY = "memgate.call"
RECEIPT_PREFERENCE = "audit-receipt"
EXEMPT = "audit_exempt"


class _HasScope(Protocol):
    @property
    def scope(self) -> Any: ...


def attach_call(scope: MutableMapping[str, Any], call: Call) -> None:
    scope[_SCOPE_KEY] = call


def call_of_scope(scope: Any) -> Call:
    call = scope.get(_SCOPE_KEY)
    if not isinstance(call, Call):
        raise TypeError("no call on this request: is the call middleware installed?")
    return call


def find_call(scope: Any) -> Call | None:
    call = scope.get(_SCOPE_KEY)
    return call if isinstance(call, Call) else None


def call_of(request: _HasScope) -> Call:
    """The call of the request a handler or guard is serving."""
    return call_of_scope(request.scope)


def operation_of(scope: MutableMapping[str, Any]) -> Operation | None:
    handler = scope.get("route_handler")
    found = getattr(handler, "opt", {}).get("operation") if handler is not None else None
    return found if isinstance(found, Operation) else None


def action_of(scope: MutableMapping[str, Any]) -> str:
    found = operation_of(scope)
    if found is not None:
        return found.name
    handler = scope.get("route_handler")
    if route_of(scope).startswith("/schema"):
        return "schema.read"
    if handler is not None and scope.get("method") == "OPTIONS":
        return "http.options"
    return "route.unmatched"


def is_exempt(scope: MutableMapping[str, Any]) -> bool:
    handler = scope.get("route_handler")
    return handler is not None and bool(getattr(handler, "opt", {}).get(EXEMPT))


def _path_ids(scope: MutableMapping[str, Any]) -> list[uuid.UUID]:
    ids: list[uuid.UUID] = []
    for value in (scope.get("path_params") or {}).values():
        try:
            ids.append(uuid.UUID(str(value)))
        except ValueError:
            continue
    return ids


def wants_receipt(scope: MutableMapping[str, Any]) -> bool:
    """`Prefer: audit-receipt` (RFC 7240: comma-separated preferences, parameters after `;`)."""
    for name, value in scope.get("headers", []):
        if name == b"prefer":
            for preference in value.decode("latin-1").split(","):
                if preference.split(";", 1)[0].strip().lower() == RECEIPT_PREFERENCE:
                    return True
    return False


def _bearer(scope: MutableMapping[str, Any]) -> str:
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" else ""
    return ""


def _describe(call: Call, scope: MutableMapping[str, Any]) -> None:
    """What only routing knows, taken when the call finishes."""
    call.action = action_of(scope)
    call.method = http_method(scope)
    call.route = route_of(scope)
    call.path_ids = _path_ids(scope)
    # An exchange may have been exempted by what it carried (an MCP tool call that left its own
    # row): the route only ever adds the exemption.
    call.exempt = call.exempt or is_exempt(scope)
    call.request_id = request_id_of(scope) or call.request_id
    call.bearer = _bearer(scope)


def receipt_header(call: Call, scope: MutableMapping[str, Any]) -> tuple[bytes, bytes] | None:
    """`Audit-Receipt` for a caller who sent `Prefer: audit-receipt`: its own row's seq and
    hash, a head it can later hold against the log. Not for the platform chain: its numbers
    would tell any anonymous caller how many calls the whole platform takes."""
    if call.receipt is None or not wants_receipt(scope):
        return None
    tenant_id, seq, row_hash = call.receipt
    if tenant_id == PLATFORM_TENANT:
        return None
    return b"audit-receipt", f"seq={seq}; hash={row_hash.hex()}".encode()


async def send_problem(send: Send, problem: Problem, path: str) -> None:
    """A problem answered on raw ASGI, by the adapters that answer outside Litestar's handlers
    (a call that could not be recorded, /mcp's body limit)."""
    body = json.dumps(problem.to_body(instance=path)).encode()
    declared = [
        (name.lower().encode(), value.encode()) for name, value in problem.headers().items()
    ]
    await send(
        {
            "type": "http.response.start",
            "status": problem.status,
            "headers": [
                (b"content-type", b"application/problem+json"),
                (b"content-length", str(len(body)).encode()),
                (b"cache-control", b"no-store"),
                *declared,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


def http_calls(app: ASGIApp, runtime: Runtime) -> ASGIApp:
    """One call per HTTP request, finished at response start (or when the app ends)."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await app(scope, receive, send)
            return
        mutable = cast(MutableMapping[str, Any], scope)
        call = Call(runtime, "route.unmatched", http_method(mutable), "unmatched")
        attach_call(mutable, call)
        replaced = False

        async def finish(status: int) -> ServiceUnavailable | None:
            _describe(call, mutable)
            return await call.finish(status)

        async def audited_send(message: Message) -> None:
            nonlocal replaced
            if message["type"] == "http.response.start" and not call.finished:
                problem = await finish(message["status"])
                if problem is not None:
                    replaced = True
                    await send_problem(send, problem, scope.get("path", ""))
                    return
                receipt = receipt_header(call, mutable)
                if receipt is not None:
                    headers = [*message.get("headers", ()), receipt]
                    headers.append((b"preference-applied", RECEIPT_PREFERENCE.encode()))
                    message = cast(Message, {**message, "headers": headers})
            elif replaced:
                return
            await send(message)

        try:
            await app(scope, receive, audited_send)
        finally:
            try:
                if not call.finished:  # the app ended without answering (client gone, crash)
                    await finish(500)
            finally:
                await call.close()

    return middleware


def check_every_route_is_an_operation(app: Any) -> None:
    """Refuse to build an app with a route that is not a declared operation (or an exempt
    probe): adding a route without deciding its scope, check and audit fails at start-up."""
    missing: list[str] = []
    wrong: list[str] = []
    for route in app.routes:
        # A mounted ASGI app (`/mcp`) is a route with one handler and no HTTP methods.
        for handler in getattr(route, "route_handlers", None) or [route.route_handler]:
            methods = getattr(handler, "http_methods", None) or {"ASGI"}
            operation = handler.opt.get("operation")
            if isinstance(operation, Operation):
                status = getattr(handler, "status_code", None)
                if methods != {"ASGI"} and status != operation.success:
                    wrong.append(f"{'/'.join(sorted(methods))} {route.path}: {status}")
                continue
            if handler.opt.get(EXEMPT):
                continue
            if route.path.startswith("/schema") or methods == {"OPTIONS"}:
                continue  # Litestar's own routes: audited as `schema.read` / `http.options`
            missing.append(f"{'/'.join(sorted(methods))} {route.path}")
    if missing:
        raise RuntimeError(
            "every route must be bound to an Operation (service/operations.py) with "
            "`**route(<operation>)` (or be an exempt probe): " + ", ".join(missing)
        )
    if wrong:
        raise RuntimeError(
            "a route answers a success status its operation does not declare (declare it with "
            "`success=` on the operation, which `route()` then sets): " + ", ".join(wrong)
        )
