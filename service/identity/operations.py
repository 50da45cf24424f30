"""The identity operations: principals, their tenant roles, and OAuth clients."""

from __future__ import annotations

from service.auth.scopes import Scope
from service.identity.problems import (
    ClientNotFound,
    ExternalIssuerUntrusted,
    ExternalSubjectTaken,
    PrincipalNotFound,
    ScopeNotAllowed,
)
from service.operations import Operation, operation
from service.policy.guards import requires_policy_admin
from service.policy.problems import LastRoleHolder, PolicyAdminRequired
from service.problems import Problem


def _admin(name: str, operation_id: str, summary: str, *problems: type[Problem]) -> Operation:
    """Managing principals and clients is managing access: the scope and role:policy_admin."""
    return operation(
        name,
        operation_id,
        summary,
        Scope.MANAGE_POLICY,
        PolicyAdminRequired,
        *problems,
        check=requires_policy_admin,
    )


PRINCIPAL_CREATE = _admin(
    "principal.create",
    "createPrincipal",
    "Create a user, agent or service principal",
    ExternalSubjectTaken,
    ExternalIssuerUntrusted,
)
PRINCIPAL_LIST = _admin("principal.list", "listPrincipals", "List the principals of your tenant")
PRINCIPAL_GET = _admin("principal.get", "getPrincipal", "Get one principal", PrincipalNotFound)
ROLE_GRANT = _admin(
    "principal.role.grant", "grantTenantRole", "Grant a tenant role", PrincipalNotFound
)
ROLE_REVOKE = _admin(
    "principal.role.revoke",
    "revokeTenantRole",
    "Take a tenant role away",
    PrincipalNotFound,
    LastRoleHolder,
)
CLIENT_CREATE = _admin(
    "client.create",
    "createClient",
    "Register an OAuth client",
    PrincipalNotFound,
    ScopeNotAllowed,
)
CLIENT_LIST = _admin("client.list", "listClients", "List the clients of your tenant")
CLIENT_GET = _admin("client.get", "getClient", "Get one client", ClientNotFound)
CLIENT_DISABLE = _admin(
    "client.disable", "disableClient", "Disable a client", ClientNotFound, LastRoleHolder
)
# Re-enabling takes registration's ceilings again (scope-not-allowed for an agent's admin client).
CLIENT_ENABLE = _admin(
    "client.enable", "enableClient", "Re-enable a client", ClientNotFound, ScopeNotAllowed
)
