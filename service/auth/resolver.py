"""Turn a verified token into a `Principal`, checking in the database that the client and the
principal are still enabled: disabling a client stops its tokens on the very next request.

The token's scopes are a ceiling, and so is who holds them: admin scopes never reach an agent
principal or a non-admin client, whatever an issuer (embedded or external) put in the token."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased

from service.auth.principal import Principal
from service.auth.scopes import ADMIN_SCOPES
from service.auth.tokens import TokenRejected, VerifiedToken
from service.db.models import Client, Delegation
from service.db.models import Principal as PrincipalRow
from service.db.tenancy import name_tenant


@dataclass(frozen=True)
class _Holder:
    principal_id: uuid.UUID
    may_hold_admin_scopes: bool


async def resolve_principal(session: AsyncSession, token: VerifiedToken) -> Principal:
    # The verified token names the tenant; row-level security shows nothing until it is named.
    await name_tenant(session, token.tenant_id)
    if token.act is not None:
        return await _delegated(session, token)
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


async def _delegated(session: AsyncSession, token: VerifiedToken) -> Principal:
    """A token-exchange token (`sub` = the user, `act.sub` = the agent whose client holds it):
    both enabled, the client the agent's, the user's consent still there. Only our own issuer's
    delegations count, one level deep, and never with admin scopes."""
    act = token.act or {}
    if not token.issuer.embedded or "act" in act:
        raise TokenRejected("only one level of delegation from this issuer is accepted")
    try:
        user_id, agent_id = uuid.UUID(token.subject), uuid.UUID(str(act.get("sub")))
        client_id = uuid.UUID(token.client_id)
    except ValueError:
        raise TokenRejected("malformed delegation") from None
    user = aliased(PrincipalRow)
    consented = await session.scalar(
        select(Delegation.agent_id)
        .join(
            user,
            (user.tenant_id == Delegation.tenant_id) & (user.id == Delegation.user_id),
        )
        .join(
            PrincipalRow,
            (PrincipalRow.tenant_id == Delegation.tenant_id)
            & (PrincipalRow.id == Delegation.agent_id),
        )
        .join(
            Client,
            (Client.tenant_id == Delegation.tenant_id)
            & (Client.principal_id == Delegation.agent_id),
        )
        .where(
            Delegation.tenant_id == token.tenant_id,
            Delegation.user_id == user_id,
            Delegation.agent_id == agent_id,
            user.disabled_at.is_(None),
            PrincipalRow.disabled_at.is_(None),
            Client.client_id == client_id,
            Client.disabled_at.is_(None),
        )
    )
    if consented is None:
        raise TokenRejected("the delegation is unknown, revoked or disabled")
    return Principal(
        tenant_id=token.tenant_id,
        principal_id=user_id,
        client_id=token.client_id,
        scopes=token.scopes - ADMIN_SCOPES,
        token_id=token.token_id,
        issuer=token.issuer.issuer,
        act=token.act,
        actor_id=agent_id,
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
