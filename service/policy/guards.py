"""The policy checks an operation needs besides its scope: role:policy_admin, the auditor role.

Each runs against the call (REST and MCP ask the same question), in the call's own transaction,
so a grant or removal counts from the very next call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from service.audit.service import AuditService
from service.auth.principal import Principal
from service.policy.service import PolicyService

if TYPE_CHECKING:
    from service.calls import Call


def _caller(call: Call) -> Principal:
    caller = call.caller
    if caller is None:
        raise TypeError("a policy check needs an authenticated call")
    return caller


async def requires_policy_admin(call: Call) -> None:
    """The caller reaches role:policy_admin in its tenant."""
    await PolicyService(call.db, _caller(call)).require_policy_admin()


async def requires_auditor(call: Call) -> None:
    """The caller holds the auditor role in its tenant."""
    await AuditService(
        call.db, call.runtime.pseudonyms, _caller(call), facts=call.facts
    ).require_auditor()
