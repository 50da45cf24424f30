"""What one call contributes to its audit row, collected while the request runs.

The recorder (recorder.py) creates one `AuditTrail` per HTTP request and keeps it in the ASGI
scope. Handlers add what only they know (targets, result counts, the identity a token request
proved) through `trail_of(request)`; the exception handler adds the problem type as the reason.
The trail also owns the request's database session, so the recorder can append the audit row
in the same transaction as the call's writes and commit both together.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from service.auth.principal import Principal

if TYPE_CHECKING:
    from service.runtime import Runtime

_SCOPE_KEY = "memgate.audit"
_NAME_CALLER = text(
    "SELECT set_config('memgate.tenant_id', :tenant, true), "
    "set_config('memgate.principal_id', :principal, true), "
    "set_config('memgate.actor_id', :actor, true)"
)
MAX_TARGETS = 1000
"""A row names at most this many target ids (a search answers at most `max_k` hits)."""


@dataclass(frozen=True)
class IssuedIdentity:
    """Who a successful token request proved to be (the caller had no bearer token)."""

    tenant_id: uuid.UUID
    subject: str
    principal_id: uuid.UUID
    client_id: str
    token_id: str
    scopes: tuple[str, ...]
    actor_subject: str | None = None
    """The acting agent of a token exchange (`act.sub`)."""


@dataclass
class AuditTrail:
    runtime: Runtime
    started: float = field(default_factory=time.perf_counter)
    targets: list[uuid.UUID] = field(default_factory=list)
    result_count: int | None = None
    reason: str | None = None
    issued: IssuedIdentity | None = None
    presented_client_id: str | None = None
    session: AsyncSession | None = None

    async def request_session(self, caller: Principal | None) -> AsyncSession:
        """The request's one transaction, begun on first use; the recorder commits it. The
        caller is named in transaction-local settings, which the row-level security policies
        on memories read (no caller: no memory row is visible)."""
        if self.session is None:
            self.session = self.runtime.sessionmaker()
            await self.session.begin()
            if caller is not None:
                await self.session.execute(
                    _NAME_CALLER,
                    {
                        "tenant": str(caller.tenant_id),
                        "principal": str(caller.principal_id),
                        "actor": str(caller.actor_id) if caller.actor_id else "",
                    },
                )
        return self.session

    def add_targets(self, ids: Iterable[uuid.UUID]) -> None:
        room = MAX_TARGETS - len(self.targets)
        self.targets.extend(list(ids)[: max(room, 0)])

    def count(self, n: int) -> None:
        self.result_count = n

    def client_presented(self, client_id: str | None) -> None:
        """A client id from an unauthenticated token request: kept only when it is a UUID, so
        whatever else a caller types into the field never reaches the log."""
        try:
            self.presented_client_id = str(uuid.UUID(client_id or ""))
        except ValueError:
            self.presented_client_id = None


def attach_trail(scope: Any, trail: AuditTrail) -> None:
    scope[_SCOPE_KEY] = trail


def trail_of_scope(scope: Any) -> AuditTrail:
    trail = scope.get(_SCOPE_KEY)
    if not isinstance(trail, AuditTrail):
        raise TypeError("no audit trail on this request: is the audit recorder installed?")
    return trail


def find_trail(scope: Any) -> AuditTrail | None:
    trail = scope.get(_SCOPE_KEY)
    return trail if isinstance(trail, AuditTrail) else None


class _HasScope(Protocol):
    @property
    def scope(self) -> Any: ...


def trail_of(request: _HasScope) -> AuditTrail:
    """The audit trail of the request a handler is serving."""
    return trail_of_scope(request.scope)
