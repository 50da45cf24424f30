"""Reads of `tenant_issuers` other features need (no policy imports: policy reads these)."""

from __future__ import annotations

import uuid

from sqlalchemy import exists, select
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.models import TenantIssuer


async def issuer_registered(
    session: AsyncSession, tenant_id: uuid.UUID, issuer: str | None
) -> bool:
    """Whether the tenant registered `issuer` (with any audience): its subjects may then be
    mapped to principals."""
    if issuer is None:
        return False
    found = await session.scalar(
        select(exists().where(TenantIssuer.tenant_id == tenant_id, TenantIssuer.issuer == issuer))
    )
    return bool(found)
