"""Operations: each use case of memgate declared once.

An `Operation` names what a caller does (`memory.search`), the token scope it needs, the policy
check it passes besides the scope, its public operation id, and the problems it can answer with.
REST routes (service/http/routes.py) and MCP tools (service/mcp/) are bound to these declarations,
the audit row names the operation, and the app refuses to start with a route or tool that is not
one. Features declare theirs in `<feature>/operations.py`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from service.auth.scopes import Scope
from service.problems import (
    BodyTooLarge,
    IdempotencyAnswerGone,
    IdempotencyKeyInFlight,
    IdempotencyKeyReused,
    InsufficientScope,
    InternalError,
    InvalidRequest,
    MalformedId,
    MalformedRequest,
    NotAuthenticated,
    PreconditionFailed,
    Problem,
    ServiceUnavailable,
    UnsupportedMediaType,
)
from service.quotas.problems import RateLimited

if TYPE_CHECKING:
    from service.calls import Call

Check = Callable[["Call"], Awaitable[None]]
"""A policy check beyond the scope (policy admin, auditor), run against the call, so REST and MCP
ask the same question."""

OPERATIONS: dict[str, Operation] = {}
"""Every declared operation by name."""

UNDECLARED: list[str] = []
"""Problems an operation answered without declaring them, while `check_answers` is on."""
_CHECKING: set[bool] = set()
"""Holds True while answers are checked (a set, so no `global` is needed to flip it)."""


@dataclass(frozen=True, eq=False)
class Operation:
    name: str
    """The audit action, `<feature>.<verb>` (`memory.search`)."""
    operation_id: str
    """The OpenAPI operation id and MCP tool base name (`searchMemories`)."""
    summary: str
    scope: Scope | None
    """The token scope the caller needs; None for a public operation (no bearer token)."""
    problems: tuple[type[Problem], ...] = ()
    """The problems the operation itself can raise (the entrance adds its own)."""
    check: Check | None = None
    takes_input: bool = True
    """False when the operation has no body, query or path input that can fail validation."""
    read_only: bool = False
    """The operation changes nothing: its transaction is read-only (a write fails loudly) and
    its audit row is group-committed with other reads' rows (service/audit/group_commit.py)."""
    authenticated: bool = False
    """With `scope=None`: the caller still needs a valid bearer token, just no particular scope
    (the MCP endpoint, whose tools each check their own operation's scope)."""
    success: int = 200
    """The status of a success: 201 for a creation, 204 for an answer without a body. The REST
    route answers it and every transport's audit row records it (an MCP tool result has no
    status of its own)."""
    idempotent: bool = False
    """Retries are safe: an `Idempotency-Key` (REST header, MCP `idempotency_key` argument)
    makes a repeat answer the first answer (service/memory/idempotency.py). The adapters do it
    for every operation so declared; every write and delete must be (a contract test)."""
    conditional: bool = False
    """The change takes `If-Match` (MCP `if_match`) naming the live version it expects; stale
    is 412 `precondition-failed` (service/memory/etags.py). The operation passes it on."""

    def __post_init__(self) -> None:
        if self.name in OPERATIONS:
            raise TypeError(f"operation {self.name!r} is declared twice")
        if any(op.operation_id == self.operation_id for op in OPERATIONS.values()):
            raise TypeError(f"operation id {self.operation_id!r} is declared twice")
        OPERATIONS[self.name] = self

    @property
    def public(self) -> bool:
        return self.scope is None and not self.authenticated

    def all_problems(self) -> tuple[type[Problem], ...]:
        """What a caller can get back: the operation's own problems plus the entrance's (token,
        scope, input validation and body size, an internal error, an audit log that cannot
        record the call)."""
        entrance: list[type[Problem]] = []
        if not self.public:
            # An authenticated call is admitted by its tenant's and client's quotas.
            entrance += [NotAuthenticated, RateLimited]
        if self.scope is not None:
            entrance.append(InsufficientScope)
        if self.takes_input:
            entrance += [
                MalformedRequest,
                MalformedId,
                UnsupportedMediaType,
                BodyTooLarge,
                InvalidRequest,
            ]
        # Anything can fail on our side (a 500 without details), and an audit log that cannot
        # record the call makes it a 503.
        entrance += [InternalError, ServiceUnavailable]
        if self.idempotent:
            entrance += [IdempotencyKeyReused, IdempotencyKeyInFlight, IdempotencyAnswerGone]
        if self.conditional:
            entrance.append(PreconditionFailed)
        return tuple(dict.fromkeys([*entrance, *self.problems]))

    def declares(self, problem_type: str) -> bool:
        """Whether `problem_type` (a problem's type URI) is one of `all_problems()`."""
        return any(problem.type_uri() == problem_type for problem in self.all_problems())


def operation(
    name: str,
    operation_id: str,
    summary: str,
    scope: Scope | None,
    *problems: type[Problem],
    check: Check | None = None,
    takes_input: bool = True,
    read_only: bool = False,
    authenticated: bool = False,
    success: int = 200,
    idempotent: bool = False,
    conditional: bool = False,
) -> Operation:
    """Declare an operation (module level, once)."""
    return Operation(
        name,
        operation_id,
        summary,
        scope,
        problems,
        check,
        takes_input,
        read_only,
        authenticated,
        success,
        idempotent,
        conditional,
    )


class Declare(Protocol):
    def __call__(
        self,
        name: str,
        operation_id: str,
        summary: str,
        *problems: type[Problem],
        read_only: bool = False,
        success: int = 200,
    ) -> Operation: ...


def family(scope: Scope, *problems: type[Problem], check: Check) -> Declare:
    """A declarer for operations sharing a scope, a policy check and the problem it raises
    (managing policy: `manage:policy` and role:policy_admin; reading the audit log)."""

    def declare(
        name: str,
        operation_id: str,
        summary: str,
        *more: type[Problem],
        read_only: bool = False,
        success: int = 200,
    ) -> Operation:
        return operation(
            name,
            operation_id,
            summary,
            scope,
            *problems,
            *more,
            check=check,
            read_only=read_only,
            success=success,
        )

    return declare


def check_answers(on: bool = True) -> None:
    """Record every problem an operation answers that it does not declare (the test suite
    turns this on, so a declaration that lies fails the test that provoked it). Off, the HTTP
    adapter is not even installed (service/http/answers.py)."""
    _CHECKING.clear()
    if on:
        _CHECKING.add(True)


def checking_answers() -> bool:
    return bool(_CHECKING)


def answered(operation: Operation, problem_type: str) -> None:
    """Note that `operation` answered the problem `problem_type` (its type URI)."""
    if _CHECKING and not operation.declares(problem_type):
        UNDECLARED.append(f"{operation.name} ({operation.operation_id}) answered {problem_type}")
