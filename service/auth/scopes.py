"""OAuth scopes (Atlassian style `action:resource`). A scope is a ceiling; policy decides inside."""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING

from service.problems import InsufficientScope

if TYPE_CHECKING:
    from service.auth.principal import Principal


class Scope(StrEnum):
    READ_MEMORY = "read:memory"
    WRITE_MEMORY = "write:memory"
    DELETE_MEMORY = "delete:memory"
    REVIEW_MEMORY = "review:memory"
    """Approve and reject proposals, and write past review, where policy grants `review`
    (docs/concepts.md, "Review"). Never effective on a delegated token or for an agent."""
    READ_POLICY = "read:policy"
    MANAGE_POLICY = "manage:policy"
    MANAGE_DELEGATES = "manage:delegates"
    """Decide which agents may act for a user (RFC 8693 consent): the user's own decision,
    not one a read-only token may make."""
    READ_AUDIT = "read:audit"
    MANAGE_ERASURE = "manage:erasure"
    RUN_JOBS = "run:jobs"
    MANAGE_TENANT = "manage:tenant"


ALL_SCOPES: frozenset[str] = frozenset(s.value for s in Scope)
ADMIN_SCOPES: frozenset[str] = frozenset(
    {
        Scope.MANAGE_POLICY,
        Scope.READ_AUDIT,
        Scope.MANAGE_ERASURE,
        Scope.RUN_JOBS,
        Scope.MANAGE_TENANT,
    }
)
"""Never issued to agent clients, whatever they ask for or were registered with."""

AGENT_SCOPES: frozenset[str] = ALL_SCOPES - ADMIN_SCOPES


def parse_scopes(raw: object) -> frozenset[str]:
    """Scopes from a `scope` string (RFC 8693/9068) or an `scp` list (Entra style)."""
    if isinstance(raw, str):
        return frozenset(raw.split())
    if isinstance(raw, list | tuple):
        return frozenset(s for s in raw if isinstance(s, str))
    return frozenset()


def insufficient_scope(principal: Principal, scope: Scope) -> InsufficientScope:
    """The refusal of a call whose token lacks `scope`, in the same words over REST and MCP."""
    return InsufficientScope(
        f"This call needs the '{scope}' scope; the token has "
        f"'{' '.join(sorted(principal.scopes)) or 'none'}'. Request a token with "
        f"scope={scope} (the client must be registered for it).",
        required_scope=str(scope),
    )
