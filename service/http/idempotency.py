"""REST's side of idempotency keys: the route hooks every `idempotent` operation gets from
`route()` (service/http/routes.py), so its handler knows nothing of keys.

`before_request` (after authentication, guards and the strict body check) claims the
`Idempotency-Key`: a stored answer is sent again as it was, with `Idempotent-Replayed: true`,
and the handler does not run. `after_request` (still inside the call's transaction: the call
commits when the response starts) keeps the handler's answer under the key. What a key stands
for and how it is kept: service/memory/idempotency.py.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

import msgspec
from litestar import Request, Response

from service.calls import Call
from service.http.audit import call_of
from service.http.body import strict_request
from service.memory import idempotency
from service.operations import Operation

HEADER = "Idempotency-Key"
REPLAYED = "Idempotent-Replayed"

_CLAIMED: ContextVar[tuple[Call, idempotency.Key] | None] = ContextVar(
    "memgate_idempotency_claimed", default=None
)
"""The key this request claimed, from `before_request` to `after_request` (one task)."""


async def claim_key(request: Request[Any, Any, Any]) -> Response[bytes | None] | None:
    """`before_request` of an idempotent route: the strict checks first (a malformed request
    never touches a key), then the key, if the request carries one."""
    _CLAIMED.set(None)
    await strict_request(request)
    raw = request.headers.get(HEADER)
    operation = request.route_handler.opt.get("operation")
    if raw is None or not isinstance(operation, Operation):
        return None
    call = call_of(request)
    caller = request.user
    target = f"{request.url.path}\nIf-Match: {request.headers.get('If-Match', '')}"
    identity = idempotency.request_identity(
        operation.name, f"http {request.method}", target, await request.body()
    )
    key = idempotency.key_of(caller, raw, identity)
    replay = await idempotency.claim(call.db, caller, call.facts, key)
    if replay is not None:
        return Response(
            replay.body or None,
            status_code=replay.status,
            media_type="application/json",
            headers={REPLAYED: "true", **_etag_of(replay.body)},
        )
    _CLAIMED.set((call, key))
    return None


def _etag_of(body: bytes) -> dict[str, str]:
    """A replayed write's `ETag` header, as the first answer had it: its memory's `etag`."""
    try:
        answer = msgspec.json.decode(body) if body else None
    except msgspec.DecodeError:
        return {}
    memory = answer.get("memory") if isinstance(answer, dict) else None
    etag = memory.get("etag") if isinstance(memory, dict) else None
    return {"ETag": etag} if isinstance(etag, str) else {}


async def keep_answer(response: Response[Any]) -> Response[Any]:
    """`after_request` of an idempotent route: a success is kept under the claimed key and
    sent as the very bytes kept (a replay is byte for byte the first answer)."""
    claimed = _CLAIMED.get()
    _CLAIMED.set(None)
    status = response.status_code
    if claimed is None or status is None or not 200 <= status < 300:
        return response
    call, key = claimed
    body = await idempotency.settle(call.db, key, status, response.content)
    if response.content is not None:
        response.content = body
        response.media_type = "application/json"
    return response
