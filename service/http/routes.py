"""REST routes bound to operations: `@post("/search", **route(ops.SEARCH))`.

The scope guard, the policy check, the audit action, the operation id and the summary all come
from the one declaration (service/operations.py); the route adds only its path and method.
"""

from __future__ import annotations

from typing import Any

from service.auth.guards import AnyConnection, requires
from service.http.audit import call_of_scope
from service.http.idempotency import claim_key, keep_answer
from service.operations import Operation

PUBLIC = "exclude_from_auth"
"""Route option the bearer authentication skips (public operations: token, discovery)."""


def _checked(operation: Operation) -> Any:
    check = operation.check
    assert check is not None

    async def guard(connection: AnyConnection, _: Any) -> None:
        await check(call_of_scope(connection.scope))

    guard.__name__ = f"check_{operation.name.replace('.', '_')}"
    return guard


def route(operation: Operation, **extra: Any) -> dict[str, Any]:
    """Keyword arguments of a Litestar route decorator serving `operation`."""
    guards: list[Any] = []
    if operation.scope is not None:
        guards.append(requires(operation.scope))
    if operation.check is not None:
        guards.append(_checked(operation))
    opt: dict[str, Any] = {**extra.pop("opt", {}), "operation": operation, "action": operation.name}
    kwargs: dict[str, Any] = {
        "guards": guards,
        "opt": opt,
        "operation_id": operation.operation_id,
        "summary": operation.summary,
    }
    if operation.success != 200:
        kwargs["status_code"] = operation.success
    if operation.idempotent:  # the key is claimed and kept around the handler, whatever it is
        kwargs["before_request"], kwargs["after_request"] = claim_key, keep_answer
    if operation.public:
        opt[PUBLIC] = True
        kwargs["security"] = []
    kwargs.update(extra)
    return kwargs
