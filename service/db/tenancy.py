"""Naming the tenant a transaction works in, for row-level security.

Every tenant table's policy reads `memgate.tenant_id` (transaction-local, `set_config(...,
true)`): no setting, no rows. A call names its caller (service/calls.py); the few
steps that learn the tenant on the way name it here, each from something already proven: a
verified token's `tenant` claim, a tenant just created, the tenant of an audit row the recorder
built from the caller.
"""

from __future__ import annotations

import uuid

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.driver import built_once, run

_NAME_TENANT = built_once(text("SELECT set_config('memgate.tenant_id', :tenant, true)"))


async def name_tenant(session: AsyncSession, tenant_id: uuid.UUID) -> None:
    """Name `tenant_id` for the rest of the session's current transaction."""
    await run(session, _NAME_TENANT, {"tenant": str(tenant_id)})
