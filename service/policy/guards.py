"""The policy grant a route needs besides its scope: membership of role:policy_admin."""

from __future__ import annotations

from typing import Any

from service.audit.trail import trail_of_scope
from service.auth.guards import AnyConnection
from service.policy.service import PolicyService


async def requires_policy_admin(connection: AnyConnection, _: Any) -> None:
    """After the scope guard: the caller reaches role:policy_admin in its tenant (read in the
    request's own transaction, so a grant or removal counts from the very next request)."""
    session = await trail_of_scope(connection.scope).request_session(connection.user)
    await PolicyService(session, connection.user).require_policy_admin()
