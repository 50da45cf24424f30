"""The policy checks an operation needs besides its scope: role:policy_admin (the policy and
identity admin API), role:auditor (the audit log) or role:eraser (erasure).

Each runs against the call (REST and MCP ask the same question) and reads the compiled role
closure (`principal_roles`) in the call's own transaction: one primary-key lookup, no walk over
the rules, and a grant or removal counts from the very next call (every policy change rebuilds
the closure in the transaction that commits it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import select

from service.audit.problems import AuditorRoleRequired
from service.auth.principal import Principal
from service.db.models import Principal as PrincipalRow
from service.erasure.problems import EraserRoleRequired
from service.policy.powers import holds_role
from service.policy.problems import AgentPolicyReadOff
from service.policy.rules import AUDITOR, ERASER
from service.policy.service import PolicyService
from service.problems import Problem

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
    """The caller reaches role:auditor in its tenant."""
    await _requires_role(
        call,
        AUDITOR,
        AuditorRoleRequired(
            "Reading the audit log needs the auditor role as well as 'read:audit'. An admin "
            "grants it with PUT /v1/principals/{principal_id}/roles/auditor."
        ),
    )


async def _requires_role(call: Call, role: str, refusal: Problem) -> None:
    caller = _caller(call)
    if not await holds_role(call.db, caller.tenant_id, caller.principal_id, role):
        raise refusal


async def agents_may_read_policy(call: Call) -> None:
    """Unless the caller's tenant keeps `read:policy` from agents, nothing to check; then an
    agent (or a token an agent holds for a user) is refused. A client registered before the
    setting changed may still carry the scope: this is where it stops."""
    caller = _caller(call)
    if caller.tenant_settings.agents_may_read_policy:
        return
    kind = await call.db.scalar(
        select(PrincipalRow.kind).where(
            PrincipalRow.tenant_id == caller.tenant_id,
            PrincipalRow.id == caller.principal_id,
        )
    )
    if caller.actor_id is not None or kind == "agent":
        raise AgentPolicyReadOff(
            "Your tenant's settings keep 'read:policy' from agents; ask a tenant admin (who "
            "may read the policy) instead."
        )


async def requires_eraser(call: Call) -> None:
    """The caller reaches role:eraser in its tenant."""
    await _requires_role(
        call,
        ERASER,
        EraserRoleRequired(
            "Erasure needs the eraser role as well as 'manage:erasure'. An admin holding "
            "'manage:erasure' grants it with PUT /v1/principals/{principal_id}/roles/eraser."
        ),
    )
