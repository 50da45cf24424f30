"""Turn a verified token into a `Principal`, checking in the database that the client and the
principal are still enabled: disabling a client stops its tokens on the very next request.

The token's scopes are a ceiling, and so is who holds them: admin scopes never reach an agent
principal or a non-admin client, whatever an issuer (embedded or external) put in the token."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from service.auth.principal import Principal
from service.auth.scopes import ADMIN_SCOPES
from service.auth.tokens import TokenRejected, VerifiedToken
from service.db.models import Client
from service.db.models import Principal as PrincipalRow


@dataclass(frozen=True)
class _Holder:
    principal_id: uuid.UUID
    may_hold_admin_scopes: bool


async def resolve_principal(session: AsyncSession, token: VerifiedToken) -> Principal:
    if token.issuer.embedded:
        holder = await _embedded_principal(session, token)
    else:
        holder = await _external_principal(session, token)
    if holder is None:
        raise TokenRejected("principal or client unknown or disabled")
    scopes = token.scopes if holder.may_hold_admin_scopes else token.scopes - ADMIN_SCOPES
    return Principal(
        tenant_id=token.tenant_id,
        principal_id=holder.principal_id,
        client_id=token.client_id,
        scopes=scopes,
        token_id=token.token_id,
        issuer=token.issuer.issuer,
        act=token.act,
    )


async def _embedded_principal(session: AsyncSession, token: VerifiedToken) -> _Holder | None:
    try:
        subject = uuid.UUID(token.subject)
        client_id = uuid.UUID(token.client_id)
    except ValueError:
        return None
    found = (
        await session.execute(
            select(PrincipalRow.id, PrincipalRow.kind, Client.kind)
            .join(
                Client,
                (Client.tenant_id == PrincipalRow.tenant_id)
                & (Client.principal_id == PrincipalRow.id),
            )
            .where(
                PrincipalRow.tenant_id == token.tenant_id,
                PrincipalRow.id == subject,
                PrincipalRow.disabled_at.is_(None),
                Client.client_id == client_id,
                Client.disabled_at.is_(None),
            )
        )
    ).one_or_none()
    if found is None:
        return None
    principal_id, principal_kind, client_kind = found
    return _Holder(principal_id, principal_kind != "agent" and client_kind == "admin")


async def _external_principal(session: AsyncSession, token: VerifiedToken) -> _Holder | None:
    found = (
        await session.execute(
            select(PrincipalRow.id, PrincipalRow.kind).where(
                PrincipalRow.tenant_id == token.tenant_id,
                PrincipalRow.external_issuer == token.issuer.issuer,
                PrincipalRow.external_subject == token.subject,
                PrincipalRow.disabled_at.is_(None),
            )
        )
    ).one_or_none()
    if found is None:
        return None
    principal_id, principal_kind = found
    return _Holder(principal_id, principal_kind != "agent")
