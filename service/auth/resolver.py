"""Turn a verified token into a `Principal`, checking in the database that the client and the
principal (and their tenant) are still enabled: disabling a client or a tenant stops its tokens on
the very next request.

The token's scopes are a ceiling, and so is who holds them: admin scopes never reach an agent
principal or a non-admin client, whatever an issuer (embedded or external) put in the token. An
external IdP has no admin clients of ours, so its tokens keep admin scopes only for a principal
whose mapping a caller holding every admin scope approved (`role:external_admin`)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import Select, Text, bindparam, case, cast, exists, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased
from sqlalchemy.sql.selectable import ScalarSelect

from service.auth.principal import Principal
from service.auth.scopes import ADMIN_SCOPES
from service.auth.tokens import TokenRejected, VerifiedToken
from service.db.models import CasbinRule, Client, Delegation, Tenant, TenantIssuer
from service.db.models import Principal as PrincipalRow
from service.policy.rules import EXTERNAL_ADMIN
from service.tenants.settings import stored


def _tenant_entrance(tenant_id: Any) -> ScalarSelect[Any]:
    """The token's tenant's settings while the tenant is enabled (not disabled, not retired),
    else NULL: sent in the entrance's first statement beside the principal's check, so a
    disabled tenant's tokens stop on their next request and the settings cost no round trip."""
    return (
        select(Tenant.settings)
        .where(
            Tenant.tenant_id == tenant_id,
            Tenant.disabled_at.is_(None),
            Tenant.retired_at.is_(None),
        )
        .scalar_subquery()
    )


TENANT_ENTRANCE = _tenant_entrance(bindparam("entrance_tenant"))
"""`_tenant_entrance` built once, for the tenant bound as `entrance_tenant` (`Entrance`)."""


TENANT_DISABLED = "principal or client unknown or disabled"
"""The refusal of a disabled tenant's token: the same as a disabled client's, so a caller
learns nothing more from it."""


@dataclass(frozen=True)
class _Holder:
    principal_id: uuid.UUID
    may_hold_admin_scopes: bool
    tenant_settings: object = None
    agent: bool = False
    """The principal is of kind agent (it never reviews: service/policy/visible.py)."""


Claimed = tuple[uuid.UUID, uuid.UUID | None, uuid.UUID | None]
"""(tenant, principal, acting agent) as a token claims them."""


def claimed_caller(token: VerifiedToken) -> Claimed:
    """(tenant, principal, acting agent) as a verified token claims them, before the database
    proves them: for our own tokens the subject is the principal id (and `act.sub` the agent);
    an external subject is known only after its mapping is read (None)."""
    if not token.issuer.embedded:
        return token.tenant_id, None, None
    try:
        principal = uuid.UUID(token.subject)
        agent = token.act.get("sub") if token.act is not None else None
        return token.tenant_id, principal, uuid.UUID(str(agent)) if agent is not None else None
    except ValueError:
        return token.tenant_id, None, None


async def resolve_principal(session: AsyncSession, token: VerifiedToken) -> Principal:
    """The principal of a verified token, read in `session`, whose transaction must already
    name the token's tenant (row-level security shows nothing until it is named)."""
    if token.act is not None:
        return await _delegated(session, token)
    if token.issuer.embedded:
        holder = await _embedded_principal(session, token)
    else:
        holder = await _external_principal(session, token)
    if holder is None:
        raise TokenRejected("principal or client unknown or disabled")
    return _principal(token, holder)


def _principal(token: VerifiedToken, holder: _Holder) -> Principal:
    scopes = token.scopes if holder.may_hold_admin_scopes else token.scopes - ADMIN_SCOPES
    return Principal(
        tenant_id=token.tenant_id,
        principal_id=holder.principal_id,
        client_id=token.client_id,
        scopes=scopes,
        token_id=token.token_id,
        issuer=token.issuer.issuer,
        act=token.act,
        embedded=token.issuer.embedded,
        issuer_id=token.issuer.issuer_id,
        tenant_settings=stored(holder.tenant_settings),
        agent=holder.agent,
    )


async def _delegated(session: AsyncSession, token: VerifiedToken) -> Principal:
    return _delegated_principal(token, await session.scalar(_delegation_live(token)))


def _delegation_live(token: VerifiedToken) -> Select[uuid.UUID]:
    """A token-exchange token (`sub` = the user, `act.sub` = the agent whose client holds it):
    both enabled, the client the agent's, the client the user's token was issued to still
    enabled (when that token was ours), the user's consent still there. Only our own issuer's
    delegations count, one level deep, and never with admin scopes. The agent's id when all
    hold, else no row."""
    act = token.act or {}
    if not token.issuer.embedded or "act" in act:
        raise TokenRejected("only one level of delegation from this issuer is accepted")
    try:
        user_id, agent_id = uuid.UUID(token.subject), uuid.UUID(str(act.get("sub")))
        client_id = uuid.UUID(token.client_id)
        user_client_id = _user_client_of(token)
        subject_issuer_id = _subject_issuer_id_of(token)
    except ValueError:
        raise TokenRejected("malformed delegation") from None
    user = aliased(PrincipalRow)
    user_client = aliased(Client)
    statement = (
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
    if user_client_id is not None:
        # The user's own client, still enabled (the same round trip).
        statement = statement.join(
            user_client,
            (user_client.tenant_id == Delegation.tenant_id)
            & (user_client.principal_id == Delegation.user_id),
        ).where(user_client.client_id == user_client_id, user_client.disabled_at.is_(None))
    if subject_issuer_id is not None:
        # The user's tenant-registered IdP is still registered (the same round trip): deleting
        # it stops the tokens exchanged from its tokens as well.
        statement = statement.where(
            exists().where(
                TenantIssuer.tenant_id == Delegation.tenant_id,
                TenantIssuer.id == subject_issuer_id,
            )
        )
    return statement


def _delegated_principal(token: VerifiedToken, consented: object) -> Principal:
    if consented is None:
        raise TokenRejected("the delegation is unknown, revoked or disabled")
    user_id, agent_id = uuid.UUID(token.subject), uuid.UUID(str((token.act or {}).get("sub")))
    return Principal(
        tenant_id=token.tenant_id,
        principal_id=user_id,
        client_id=token.client_id,
        scopes=token.scopes - ADMIN_SCOPES,
        token_id=token.token_id,
        issuer=token.issuer.issuer,
        act=token.act,
        actor_id=agent_id,
        embedded=True,
    )


def _user_client_of(token: VerifiedToken) -> uuid.UUID | None:
    """The client the user's own token was issued to, when that token was ours; None when the
    user came from an external IdP (which alone can stop that client). A delegated token that
    does not say where the user's authority came from is refused: one from before
    this check lives at most the token lifetime."""
    subject_issuer = token.claims.get("subject_issuer")
    if not isinstance(subject_issuer, str):
        raise TokenRejected("malformed delegation")
    if subject_issuer != token.issuer.issuer:
        return None
    return uuid.UUID(str(token.claims.get("subject_client_id")))


def _subject_issuer_id_of(token: VerifiedToken) -> uuid.UUID | None:
    """The registration of the tenant-registered IdP the user's own token came from (None for
    our own and the operator's issuers, which have none)."""
    registered = token.claims.get("subject_issuer_id")
    return None if registered is None else uuid.UUID(str(registered))


async def _embedded_principal(session: AsyncSession, token: VerifiedToken) -> _Holder | None:
    statement = _embedded_live(token)
    if statement is None:
        return None
    return _embedded_holder(token, await session.scalar(statement))


def _embedded_live(token: VerifiedToken) -> Select[str] | None:
    """Our own token's principal and client, both enabled, the client the principal's: what
    the principal may do (`_embedded_holder` reads it), else no row."""
    try:
        subject = uuid.UUID(token.subject)
        client_id = uuid.UUID(token.client_id)
    except ValueError:
        return None
    return _embedded_live_of(token.tenant_id, subject, client_id)


_AGENT_HOLDER, _ADMIN_HOLDER = "agent", "admin"
"""What `_embedded_live_of` answers besides "plain": an agent principal (never admin scopes,
never a reviewer), or a user or service with an admin client (may hold admin scopes)."""


def _embedded_live_of(tenant_id: Any, principal_id: Any, client_id: Any) -> Select[str]:
    standing = case(
        (PrincipalRow.kind == "agent", _AGENT_HOLDER),
        (Client.kind == "admin", _ADMIN_HOLDER),
        else_="plain",
    )
    return (
        select(standing)
        .join(
            Client,
            (Client.tenant_id == PrincipalRow.tenant_id) & (Client.principal_id == PrincipalRow.id),
        )
        .where(
            PrincipalRow.tenant_id == tenant_id,
            PrincipalRow.id == principal_id,
            PrincipalRow.disabled_at.is_(None),
            Client.client_id == client_id,
            Client.disabled_at.is_(None),
        )
    )


EMBEDDED_LIVE = _embedded_live_of(
    bindparam("live_tenant"), bindparam("live_principal"), bindparam("live_client")
).scalar_subquery()
"""`_embedded_live` built once: the statement of every plain token of our own issuer is the
same, only its bound values differ, so it is neither rebuilt nor re-keyed per request."""


def _embedded_holder(token: VerifiedToken, standing: object) -> _Holder | None:
    """`standing`: what `_embedded_live_of` answered (None: refused)."""
    if standing is None:
        return None
    return _Holder(
        uuid.UUID(token.subject), standing == _ADMIN_HOLDER, agent=standing == _AGENT_HOLDER
    )


@dataclass(frozen=True)
class Entrance:
    """The check of a token of our own issuer as one scalar subquery and the values it binds,
    for the call to send in its first statement together with the caller's naming and
    `TENANT_ENTRANCE` (service/calls.py)."""

    check: ScalarSelect[Any]
    params: dict[str, Any]
    prebuilt: bool
    """`check` is `EMBEDDED_LIVE` (the statement around it can be built once too)."""


def entrance_check(token: VerifiedToken) -> Entrance | None:
    """The entrance of a token of our own issuer: its check is non-NULL exactly when the
    principal, its client (and a delegation) still hold. None when the token's caller must be
    looked up first (an external subject) or cannot be ours (a malformed subject)."""
    if not token.issuer.embedded:
        return None
    tenant = {"entrance_tenant": token.tenant_id}
    if token.act is not None:
        try:
            return Entrance(_delegation_live(token).scalar_subquery(), tenant, prebuilt=False)
        except TokenRejected:
            return None
    try:
        principal_id, client_id = uuid.UUID(token.subject), uuid.UUID(token.client_id)
    except ValueError:
        return None
    bound = {"live_tenant": token.tenant_id, "live_principal": principal_id}
    return Entrance(EMBEDDED_LIVE, {**tenant, **bound, "live_client": client_id}, prebuilt=True)


def principal_from_check(token: VerifiedToken, value: object, settings: object) -> Principal:
    """The principal of a token whose `entrance_check` answered `value` and whose
    `TENANT_ENTRANCE` answered `settings` (either NULL: refused)."""
    if settings is None:
        raise TokenRejected(TENANT_DISABLED)
    if token.act is not None:
        return replace(_delegated_principal(token, value), tenant_settings=stored(settings))
    holder = _embedded_holder(token, value)
    if holder is None:
        raise TokenRejected("principal or client unknown or disabled")
    return _principal(token, replace(holder, tenant_settings=settings))


async def _external_principal(session: AsyncSession, token: VerifiedToken) -> _Holder | None:
    # The approval is a direct `g` line to the role (the policy service writes it only for a
    # caller holding every admin scope); the name is built the way policy/rules.py builds it.
    approved = exists().where(
        CasbinRule.tenant_id == PrincipalRow.tenant_id,
        CasbinRule.ptype == "g",
        CasbinRule.v0 == PrincipalRow.kind + ":" + cast(PrincipalRow.id, Text),
        CasbinRule.v1 == EXTERNAL_ADMIN,
    )
    # The tenant enabled, and its settings, in the same statement.
    statement = (
        select(PrincipalRow.id, PrincipalRow.kind, approved, Tenant.settings)
        .join(Tenant, Tenant.tenant_id == PrincipalRow.tenant_id)
        .where(
            PrincipalRow.tenant_id == token.tenant_id,
            PrincipalRow.external_issuer == token.issuer.issuer,
            PrincipalRow.external_subject == token.subject,
            PrincipalRow.disabled_at.is_(None),
            Tenant.disabled_at.is_(None),
            Tenant.retired_at.is_(None),
        )
    )
    if token.issuer.issuer_id is not None:
        # A tenant-registered issuer verifies from a config cached for a few seconds; whether
        # its row is still there is asked here, in the same statement: deleting an issuer
        # stops its tokens on the next request, in every worker.
        statement = statement.where(
            exists().where(
                TenantIssuer.tenant_id == PrincipalRow.tenant_id,
                TenantIssuer.id == token.issuer.issuer_id,
            )
        )
    found = (await session.execute(statement)).one_or_none()
    if found is None:
        return None
    principal_id, principal_kind, admin_approved, settings = found
    return _Holder(
        principal_id,
        principal_kind != "agent" and bool(admin_approved),
        settings,
        agent=principal_kind == "agent",
    )


async def admin_credentials_live(session: AsyncSession, caller: Principal) -> bool:
    """Whether the credentials an admin call was authenticated with still hold: its principal
    enabled and, for our own tokens, its client enabled; for an external token with admin
    scopes, its approval still there (and for a tenant-registered IdP, its registration).
    Authentication checked this at the start of the request;
    a change that must not act on stale credentials (a policy change, under the tenant's
    policy lock) checks again. Delegated calls never carry admin scopes, so never pass."""
    if caller.actor_id is not None:
        return False
    live = select(PrincipalRow.id).where(
        PrincipalRow.tenant_id == caller.tenant_id,
        PrincipalRow.id == caller.principal_id,
        PrincipalRow.disabled_at.is_(None),
    )
    if caller.embedded:
        try:
            client_id = uuid.UUID(caller.client_id)
        except ValueError:
            return False
        live = live.where(
            exists().where(
                Client.tenant_id == PrincipalRow.tenant_id,
                Client.principal_id == PrincipalRow.id,
                Client.client_id == client_id,
                Client.disabled_at.is_(None),
            )
        )
    elif caller.scopes & ADMIN_SCOPES:
        live = live.where(
            exists().where(
                CasbinRule.tenant_id == PrincipalRow.tenant_id,
                CasbinRule.ptype == "g",
                CasbinRule.v0 == PrincipalRow.kind + ":" + cast(PrincipalRow.id, Text),
                CasbinRule.v1 == EXTERNAL_ADMIN,
            )
        )
    if caller.issuer_id is not None:
        # The IdP it logged in with is still registered (deleted while it waited: refused).
        live = live.where(
            exists().where(
                TenantIssuer.tenant_id == PrincipalRow.tenant_id,
                TenantIssuer.id == caller.issuer_id,
            )
        )
    return await session.scalar(live) is not None
