"""The policy grants routes need besides their scope: membership of role:policy_admin (the
policy and identity admin API) or role:auditor (the audit log).

Both read the compiled role closure (`principal_roles`) in the request's own transaction: one
primary-key lookup, no walk over the rules, and a grant or removal counts from the very next
request (every policy change rebuilds the closure in the transaction that commits it)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from service.audit.problems import AuditorRoleRequired
from service.audit.trail import trail_of_scope
from service.auth.guards import AnyConnection
from service.auth.principal import Principal
from service.policy.powers import holds_role
from service.policy.rules import AUDITOR
from service.policy.service import PolicyService


async def _session(connection: AnyConnection) -> AsyncSession:
    """The call's session, named for its caller (the one place the guards get it from)."""
    return await trail_of_scope(connection.scope).request_session(connection.user)


async def requires_policy_admin(connection: AnyConnection, _: Any) -> None:
    """After the scope guard: the caller reaches role:policy_admin in its tenant."""
    caller: Principal = connection.user
    await PolicyService(await _session(connection), caller).require_policy_admin()


async def requires_auditor(connection: AnyConnection, _: Any) -> None:
    """After the scope guard (`read:audit`): the caller reaches role:auditor in its tenant."""
    caller: Principal = connection.user
    session = await _session(connection)
    if not await holds_role(session, caller.tenant_id, caller.principal_id, AUDITOR):
        raise AuditorRoleRequired(
            "Reading the audit log needs the auditor role as well as 'read:audit'. An admin "
            "grants it with PUT /v1/principals/{principal_id}/roles/auditor."
        )
