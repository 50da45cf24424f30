"""The platform admin check: `manage:tenant` (the operation's scope) held by a caller of the
platform tenant. A tenant admin's `manage:tenant` means "may register credentials acting as
another principal" in its own tenant, never "administers tenants"."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import select

from service.db.models import Tenant
from service.tenants.problems import PlatformAdminRequired

if TYPE_CHECKING:
    from service.calls import Call


async def requires_platform_admin(call: Call) -> None:
    """The caller's tenant is the platform tenant (its own row, which row-level security
    shows it; a delegated token never administers tenants)."""
    caller = call.caller
    if caller is None:
        raise TypeError("the platform check needs an authenticated call")
    platform = await call.db.scalar(
        select(Tenant.is_platform).where(Tenant.tenant_id == caller.tenant_id)
    )
    if not platform or caller.actor_id is not None:
        raise PlatformAdminRequired(
            "Managing tenants needs 'manage:tenant' on the platform tenant (the first start's "
            "tenant). Your token's 'manage:tenant' acts inside your own tenant only."
        )
