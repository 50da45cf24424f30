"""Setting and reading a tenant's limits (the platform admin's routes call these; no tenant
admin route does, so a tenant cannot raise its own limits). Services never commit: the call
that runs them does.

The platform admin's call names the platform tenant for row-level security; the limits rows
belong to the target tenant, so each function names the target for its own statements and
names the call's tenant again afterwards (nothing else in the transaction sees the switch).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import msgspec
from sqlalchemy import delete, func, select, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.models import TenantLimit, TenantUsage
from service.db.tenancy import name_tenant
from service.problems import InvalidRequest
from service.quotas.schemas import Limits

TENANT_SCOPE = ""
"""`client_id` of the row holding the tenant's own limits."""

_NAMED = text("SELECT current_setting('memgate.tenant_id', true)")


@asynccontextmanager
async def _naming(session: AsyncSession, tenant_id: uuid.UUID) -> AsyncIterator[None]:
    before = (await session.execute(_NAMED)).scalar_one_or_none() or ""
    await name_tenant(session, tenant_id)
    try:
        yield
    finally:
        await session.execute(
            text("SELECT set_config('memgate.tenant_id', :t, true)"), {"t": before}
        )


def _scope(client_id: str | None) -> str:
    return TENANT_SCOPE if client_id is None else client_id


async def set_limits(
    session: AsyncSession, tenant_id: uuid.UUID, limits: Limits, client_id: str | None = None
) -> Limits:
    """Replace the limits of the tenant (or of its client `client_id`); an empty `Limits`
    removes them. Inconsistent limits are a 422 naming the fields, and nothing changes.
    Every replica applies the change within `MEMGATE_QUOTA_CONFIG_SECONDS`."""
    problems = limits.problems(for_client=client_id is not None)
    if problems:
        fields = ", ".join(p["field"] for p in problems)
        raise InvalidRequest(f"The limits are inconsistent ({fields}).", errors=problems)
    scope = _scope(client_id)
    async with _naming(session, tenant_id):
        if limits.empty:
            await session.execute(
                delete(TenantLimit).where(
                    TenantLimit.tenant_id == tenant_id, TenantLimit.client_id == scope
                )
            )
            return limits
        values = msgspec.to_builtins(limits)
        statement = insert(TenantLimit).values(tenant_id=tenant_id, client_id=scope, limits=values)
        await session.execute(
            statement.on_conflict_do_update(
                index_elements=[TenantLimit.tenant_id, TenantLimit.client_id],
                set_={"limits": values, "updated_at": func.now()},
            )
        )
    return limits


async def limits_of(
    session: AsyncSession, tenant_id: uuid.UUID, client_id: str | None = None
) -> Limits:
    """The limits set on the tenant (or on its client), an empty `Limits` when none are."""
    async with _naming(session, tenant_id):
        stored = (
            await session.execute(
                select(TenantLimit.limits).where(
                    TenantLimit.tenant_id == tenant_id, TenantLimit.client_id == _scope(client_id)
                )
            )
        ).scalar_one_or_none()
    return Limits() if stored is None else msgspec.convert(stored, Limits)


async def all_limits_of(session: AsyncSession, tenant_id: uuid.UUID) -> dict[str, Limits]:
    """Every limits row of the tenant in the transaction's tenant (`''`: the tenant's own)."""
    rows = await session.execute(
        select(TenantLimit.client_id, TenantLimit.limits).where(TenantLimit.tenant_id == tenant_id)
    )
    return {scope: msgspec.convert(stored, Limits) for scope, stored in rows.all()}


async def usage_of(session: AsyncSession, tenant_id: uuid.UUID) -> tuple[int, int]:
    """(stored memories, their bytes) the tenant holds, for the platform admin."""
    async with _naming(session, tenant_id):
        return await counted_usage(session, tenant_id)


async def counted_usage(session: AsyncSession, tenant_id: uuid.UUID) -> tuple[int, int]:
    """The same in a transaction that names the tenant already: the committed counts plus
    this transaction's own writes (one statement over the tenant's 16 stripes)."""
    row = (
        await session.execute(
            select(
                func.coalesce(func.sum(TenantUsage.stored_count), 0),
                func.coalesce(func.sum(TenantUsage.stored_bytes), 0),
            ).where(TenantUsage.tenant_id == tenant_id)
        )
    ).one()
    return int(row[0]), int(row[1])
