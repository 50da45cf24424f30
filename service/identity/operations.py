"""The identity operations: principals, their tenant roles, and OAuth clients."""

from __future__ import annotations

from service.identity.problems import (
    ClientNotFound,
    ExternalIssuerUntrusted,
    ExternalSubjectTaken,
    JobPrincipalReserved,
    PrincipalNotFound,
    ScopeNotAllowed,
)
from service.policy.operations import managed
from service.policy.problems import LastRoleHolder

PRINCIPAL_CREATE = managed(
    "principal.create",
    "createPrincipal",
    "Create a user, agent or service principal",
    ExternalSubjectTaken,
    ExternalIssuerUntrusted,
    success=201,
)
PRINCIPAL_LIST = managed(
    "principal.list", "listPrincipals", "List the principals of your tenant", read_only=True
)
PRINCIPAL_GET = managed(
    "principal.get", "getPrincipal", "Get one principal", PrincipalNotFound, read_only=True
)
ROLE_GRANT = managed(
    "principal.role.grant", "grantTenantRole", "Grant a tenant role", PrincipalNotFound
)
ROLE_REVOKE = managed(
    "principal.role.revoke",
    "revokeTenantRole",
    "Take a tenant role away",
    PrincipalNotFound,
    LastRoleHolder,
    success=204,
)
CLIENT_CREATE = managed(
    "client.create",
    "createClient",
    "Register an OAuth client",
    PrincipalNotFound,
    ScopeNotAllowed,
    JobPrincipalReserved,
    success=201,
)
CLIENT_LIST = managed(
    "client.list", "listClients", "List the clients of your tenant", read_only=True
)
CLIENT_GET = managed("client.get", "getClient", "Get one client", ClientNotFound, read_only=True)
CLIENT_DISABLE = managed(
    "client.disable", "disableClient", "Disable a client", ClientNotFound, LastRoleHolder
)
# Re-enabling takes registration's ceilings again (scope-not-allowed for an agent's admin client).
CLIENT_ENABLE = managed(
    "client.enable",
    "enableClient",
    "Re-enable a client",
    ClientNotFound,
    ScopeNotAllowed,
    JobPrincipalReserved,
)
