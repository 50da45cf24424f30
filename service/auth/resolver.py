"""Turn a verified token into a `Principal`, checking in the database that the client and the
principal are still enabled: disabling a client stops its tokens on the very next request."""

from __future__ import annotations

import uuid

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from service.auth.principal import Principal
from service.auth.tokens import TokenRejected, VerifiedToken
from service.db.models import Client
from service.db.models import Principal as PrincipalRow


async def resolve_principal(session: AsyncSession, token: VerifiedToken) -> Principal:
    if token.issuer.embedded:
        principal_id = await _embedded_principal(session, token)
    else:
        principal_id = await _external_principal(session, token)
    if principal_id is None:
        raise TokenRejected("principal or client unknown or disabled")
    return Principal(
        tenant_id=token.tenant_id,
        principal_id=principal_id,
        client_id=token.client_id,
        scopes=token.scopes,
        token_id=token.token_id,
        issuer=token.issuer.issuer,
        act=token.act,
    )


async def _embedded_principal(session: AsyncSession, token: VerifiedToken) -> uuid.UUID | None:
    try:
        subject = uuid.UUID(token.subject)
        client_id = uuid.UUID(token.client_id)
    except ValueError:
        return None
    found: uuid.UUID | None = await session.scalar(
        select(PrincipalRow.id)
        .join(
            Client,
            (Client.tenant_id == PrincipalRow.tenant_id) & (Client.principal_id == PrincipalRow.id),
        )
        .where(
            PrincipalRow.tenant_id == token.tenant_id,
            PrincipalRow.id == subject,
            PrincipalRow.disabled_at.is_(None),
            Client.client_id == client_id,
            Client.disabled_at.is_(None),
        )
    )
    return found


async def _external_principal(session: AsyncSession, token: VerifiedToken) -> uuid.UUID | None:
    found: uuid.UUID | None = await session.scalar(
        select(PrincipalRow.id).where(
            PrincipalRow.tenant_id == token.tenant_id,
            PrincipalRow.external_issuer == token.issuer.issuer,
            PrincipalRow.external_subject == token.subject,
            PrincipalRow.disabled_at.is_(None),
        )
    )
    return found
