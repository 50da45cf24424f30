"""Problems of the tenant (platform) API."""

from __future__ import annotations

from service.problems import Problem


class PlatformAdminRequired(
    Problem, slug="platform-admin-required", status=403, title="Platform admin required"
):
    """Managing tenants needs `manage:tenant` on the platform tenant; a tenant admin's
    `manage:tenant` acts inside its own tenant only."""


class TenantNotFound(Problem, slug="tenant-not-found", status=404, title="Tenant not found"):
    """No tenant with this id (a retired tenant is not found either)."""


class PlatformTenantLocked(
    Problem, slug="platform-tenant-locked", status=409, title="The platform tenant stays"
):
    """The platform tenant cannot be disabled or deleted: its admins are the only ones who
    could enable it again (the owner-lockout rule)."""


class TenantSettingsInvalid(
    Problem, slug="tenant-settings-invalid", status=422, title="Invalid tenant settings"
):
    """A setting is unknown, of the wrong type, or out of its range (`field`, `allowed`)."""


class TenantNotDisabled(
    Problem, slug="tenant-not-disabled", status=409, title="Disable the tenant first"
):
    """A tenant is deleted only once disabled, so nothing of it runs while it goes."""


class ConfirmationInvalid(
    Problem, slug="deletion-confirmation-invalid", status=422, title="Confirmation invalid"
):
    """The `confirm` value is not the current one of this tenant's deletion plan (it is bound
    to the tenant and to what the plan counted, and expires)."""
