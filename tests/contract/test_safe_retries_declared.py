"""Every write is safe to retry (issue 15): an operation that writes or deletes memories for a
caller is declared `idempotent`, so its REST route and its MCP tool take an Idempotency-Key by
that one flag. An operation added later (revoke, reinstate, approve, reject …) fails here until
it is declared so."""

from __future__ import annotations

from service.app import create_app
from service.auth.scopes import Scope
from service.http.idempotency import claim_key, keep_answer
from service.operations import OPERATIONS, Operation

WRITE_SCOPES = frozenset({Scope.WRITE_MEMORY, Scope.DELETE_MEMORY})
JOB_SCOPES = frozenset({Scope.RUN_JOBS})


def _changes_memories(operation: Operation) -> bool:
    """A write or delete scope, or a memory operation that changes something for a caller
    (whatever scope it is given; jobs run as the job principal and are idempotent by design)."""
    if operation.scope in WRITE_SCOPES:
        return True
    return (
        operation.name.startswith("memory.")
        and not operation.read_only
        and operation.scope not in JOB_SCOPES
    )


def test_every_write_and_delete_operation_is_idempotent() -> None:
    create_app(None)  # every feature's operations declared
    writes = [op for op in OPERATIONS.values() if _changes_memories(op)]
    assert {op.name for op in writes} >= {
        "memory.write",
        "memory.write_batch",
        "memory.revert",
        "memory.delete",
    }
    assert [op.name for op in writes if not op.idempotent] == []


def test_every_idempotent_route_claims_and_keeps_its_key() -> None:
    app = create_app(None)
    served = [
        handler
        for route in app.routes
        for handler in getattr(route, "route_handlers", [])
        if getattr(handler.opt.get("operation"), "idempotent", False)
    ]
    assert served
    for handler in served:
        assert handler.resolve_before_request() is claim_key, handler
        assert handler.after_request is keep_answer, handler
