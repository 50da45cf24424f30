"""The tenant operations: the platform admin creates, configures, disables and deletes tenants.

`platform` is the declarer of every platform operation (scope `manage:tenant`, the caller's
tenant the platform tenant): other features declare theirs with it (quotas' limits routes)."""

from __future__ import annotations

from service.auth.scopes import Scope
from service.identity.problems import ClientNotFound
from service.operations import family
from service.problems import BadCursor
from service.tenants.guards import requires_platform_admin
from service.tenants.problems import (
    ConfirmationInvalid,
    PlatformAdminRequired,
    PlatformTenantLocked,
    TenantNotDisabled,
    TenantNotFound,
    TenantSettingsInvalid,
)

platform = family(Scope.MANAGE_TENANT, PlatformAdminRequired, check=requires_platform_admin)
"""Platform administration: `manage:tenant` on the platform tenant."""

TENANT_CREATE = platform(
    "tenant.create",
    "createTenant",
    "Create a tenant and its first admin client",
    TenantSettingsInvalid,
    success=201,
)
TENANT_LIST = platform("tenant.list", "listTenants", "List the tenants", BadCursor, read_only=True)
TENANT_GET = platform("tenant.get", "getTenant", "Get one tenant", TenantNotFound, read_only=True)
TENANT_UPDATE = platform(
    "tenant.update",
    "updateTenant",
    "Rename a tenant or change its settings",
    TenantNotFound,
    TenantSettingsInvalid,
)
TENANT_DISABLE = platform(
    "tenant.disable",
    "disableTenant",
    "Disable a tenant: its tokens stop on their next request",
    TenantNotFound,
    PlatformTenantLocked,
)
TENANT_ENABLE = platform("tenant.enable", "enableTenant", "Enable a tenant again", TenantNotFound)
TENANT_DELETE = platform(
    "tenant.delete",
    "deleteTenant",
    "Plan, then carry out, a tenant's deletion",
    TenantNotFound,
    PlatformTenantLocked,
    TenantNotDisabled,
    ConfirmationInvalid,
)

TENANT_PROOF = platform(
    "tenant.proof",
    "getTenantErasureProof",
    "What a deleted tenant's erasure left, and its evidence",
    TenantNotFound,
    read_only=True,
)

TENANT_LIMITS_GET = platform(
    "tenant.limits.get",
    "getTenantLimits",
    "Get a tenant's quotas and what it holds",
    TenantNotFound,
    read_only=True,
)
TENANT_LIMITS_SET = platform(
    "tenant.limits.set",
    "setTenantLimits",
    "Replace a tenant's quotas (an empty body removes them)",
    TenantNotFound,
)
CLIENT_LIMITS_SET = platform(
    "tenant.client.limits.set",
    "setClientLimits",
    "Replace the quotas of one client of a tenant (an empty body removes them)",
    TenantNotFound,
    ClientNotFound,
)
