"""Revoke and reinstate: served as REST routes and MCP tools.

Scope `delete:memory` and the delete grant on the memory's space (plus read, as every change):
revoking takes a fact out of every reader's reach, as deleting does, and `write` never implies
it (promise 4). docs/security-model.md names the choice."""

from __future__ import annotations

from service.auth.scopes import Scope
from service.memory.problems import MemoryNotFound
from service.operations import operation
from service.revocation.problems import (
    MemoryAlreadyHidden,
    MemoryNotRevoked,
    NotTheRevokedMemory,
    ReasonQuotesContent,
)

REVOKE = operation(
    "memory.revoke",
    "revokeMemory",
    "Revoke a memory: it, its re-writes and what derives from it reach no reader again",
    Scope.DELETE_MEMORY,
    MemoryNotFound,
    MemoryAlreadyHidden,
    ReasonQuotesContent,
    idempotent=True,
    conditional=True,
)
REINSTATE = operation(
    "memory.reinstate",
    "reinstateMemory",
    "Reinstate a revoked memory: what its revocation hid comes back",
    Scope.DELETE_MEMORY,
    MemoryNotFound,
    MemoryNotRevoked,
    NotTheRevokedMemory,
    ReasonQuotesContent,
    idempotent=True,
    conditional=True,
)
