"""Register, list, read and delete the external issuers of the caller's tenant. Services never
commit; the call owns the transaction.

Nothing a tenant admin registers can yield a token for another tenant: a registered issuer's
tokens always belong to the registering tenant (service/auth/tokens.py), the (issuer, audience)
pair that selects it is unique across the platform (a second registration of it is refused
with the same answer whoever holds it), and memgate's own issuer and the operator's issuers,
whose tokens name their tenant in a claim, cannot be registered at all.

Within a tenant, an issuer's tokens act as every principal mapped to its `iss`, so a tenant
registers an `iss` once, and registering or deleting one that principals are mapped to takes the
ceilings of handing out their credentials (red-team pass on tenant issuers, F1): `manage:tenant`,
and every admin scope when one of them is an admin.
"""

from __future__ import annotations

import uuid

from sqlalchemy import delete, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from service.auth.principal import Principal as Caller
from service.auth.scopes import ADMIN_SCOPES, Scope
from service.calls import Facts
from service.db.base import uuid7
from service.db.models import TenantIssuer
from service.issuers.jwks import UrlRefused, check_url
from service.issuers.problems import (
    IssuerInvalid,
    IssuerLimit,
    IssuerNotFound,
    IssuerReserved,
    IssuerTaken,
)
from service.issuers.schemas import IssuerCreate, IssuerOut
from service.policy.powers import mapped_to_issuer, working_auditors, working_policy_admins
from service.policy.problems import LastRoleHolder
from service.policy.service import PolicyService
from service.problems import InsufficientScope

MAX_ISSUERS_PER_TENANT = 10
"""Bounds what one tenant adds to every worker's caches and key fetches."""
ALGORITHMS = ("RS256", "ES256", "EdDSA")
"""The asymmetric algorithms memgate verifies (the operator's default pair and the embedded
issuer's EdDSA); symmetric ones would make the key a shared secret the IdP must give us."""


class IssuerService:
    def __init__(
        self,
        session: AsyncSession,
        caller: Caller,
        *,
        own_issuer: str,
        operator_issuers: frozenset[str],
        allow_loopback: bool,
        facts: Facts | None = None,
    ) -> None:
        """`own_issuer` (memgate's `iss`) and `operator_issuers` (`MEMGATE_EXTERNAL_ISSUERS`)
        are reserved: their tokens name their tenant in a claim, so no tenant may register
        them. `allow_loopback`: `MEMGATE_TENANT_ISSUERS_ALLOW_LOOPBACK`."""
        self._session = session
        self._caller = caller
        self._tenant_id = caller.tenant_id
        self._reserved = frozenset(i.rstrip("/") for i in {own_issuer, *operator_issuers})
        self._operator_issuers = operator_issuers
        self._allow_loopback = allow_loopback
        self._facts = facts or Facts()

    async def create(self, data: IssuerCreate) -> IssuerOut:
        self._validate(data)
        await self._policy().lock_and_recheck()
        await self._refuse_second_registration(data)
        await self._require_may_speak_for(data.issuer)
        count = await self._session.scalar(
            select(func.count())
            .select_from(TenantIssuer)
            .where(TenantIssuer.tenant_id == self._tenant_id)
        )
        if (count or 0) >= MAX_ISSUERS_PER_TENANT:
            raise IssuerLimit(
                f"Your tenant has {MAX_ISSUERS_PER_TENANT} issuers, the most allowed; delete one "
                "you no longer use (DELETE /v1/issuers/{issuer_id}) first. Nothing was changed."
            )
        row = TenantIssuer(
            tenant_id=self._tenant_id,
            id=uuid7(),
            issuer=data.issuer,
            audience=data.audience,
            jwks_url=data.jwks_url,
            algorithms=list(dict.fromkeys(data.algorithms)),
            require_typ=data.require_typ,
            subject_claim=data.subject_claim,
            scope_claim=data.scope_claim,
            client_id_claim=data.client_id_claim,
        )
        try:
            async with self._session.begin_nested():
                self._session.add(row)
                await self._session.flush()
        except IntegrityError:
            # The same answer whether your tenant or another one holds the pair: telling them
            # apart would tell you which IdPs and audiences other tenants use.
            raise _taken() from None
        await self._session.refresh(row)
        self._facts.add_targets([row.id])
        return _out(row)

    async def list(self) -> list[IssuerOut]:
        rows = await self._session.scalars(
            select(TenantIssuer)
            .where(TenantIssuer.tenant_id == self._tenant_id)
            .order_by(TenantIssuer.id)
        )
        items = [_out(row) for row in rows]
        self._facts.count(len(items))
        return items

    async def get(self, issuer_id: uuid.UUID) -> IssuerOut:
        row = await self._session.get(TenantIssuer, (self._tenant_id, issuer_id))
        if row is None:
            raise _not_found(issuer_id)
        self._facts.add_targets([issuer_id])
        return _out(row)

    async def delete(self, issuer_id: uuid.UUID) -> None:
        """Its tokens stop on their next request. Not when the issuer is how the tenant's last
        working policy admin or auditor logs in (nobody could manage the tenant, or read its
        audit log, any more)."""
        await self._policy().lock_and_recheck()
        row = await self._session.get(TenantIssuer, (self._tenant_id, issuer_id))
        if row is None:
            raise _not_found(issuer_id)
        await self._require_may_speak_for(row.issuer)
        had_auditors = await working_auditors(
            self._session, self._tenant_id, self._operator_issuers
        )
        await self._session.execute(
            delete(TenantIssuer).where(
                TenantIssuer.tenant_id == self._tenant_id, TenantIssuer.id == issuer_id
            )
        )
        if not await working_policy_admins(self._session, self._tenant_id, self._operator_issuers):
            raise LastRoleHolder(
                "Your tenant's last working policy admin logs in through this issuer: deleting "
                "it would leave nobody able to manage your tenant. Nothing was changed. Give "
                "another user an admin client with manage:policy first."
            )
        if had_auditors and not await working_auditors(
            self._session, self._tenant_id, self._operator_issuers
        ):
            raise LastRoleHolder(
                "Your tenant's last working auditor logs in through this issuer: deleting it "
                "would leave nobody able to read the audit log. Nothing was changed. Give "
                "another auditor an admin client with read:audit first."
            )
        self._facts.add_targets([issuer_id])

    async def _refuse_second_registration(self, data: IssuerCreate) -> None:
        """One registration per `iss` in a tenant: principals map to an issuer by `iss` alone,
        so a second one (another audience, its own JWKS) would speak for the first one's
        principals. The exact pair answers as when another tenant holds it."""
        held = await self._session.scalar(
            select(TenantIssuer).where(
                TenantIssuer.tenant_id == self._tenant_id, TenantIssuer.issuer == data.issuer
            )
        )
        if held is None:
            return
        if held.audience == data.audience:
            raise _taken()
        raise IssuerTaken(
            f"Your tenant registered this issuer already (issuer {held.id}, with another "
            "audience), and a tenant registers an issuer once: principals are mapped to it by "
            "its iss, so a second registration with keys of its own would act as them. To "
            f"change the audience, DELETE /v1/issuers/{held.id} first, then register it "
            "again. Nothing was changed."
        )

    async def _require_may_speak_for(self, issuer: str) -> None:
        """Whoever holds the keys of `issuer`'s registration acts as every principal mapped to
        it, so registering or deleting it takes the ceilings of handing out their credentials:
        `manage:tenant` (like a client acting as another principal), and every admin scope when
        one of them is an admin (an approved mapping, or a policy admin or auditor), the
        ceiling of the approval itself. Nobody hands out, or takes away, more than they have."""
        mapped, admin = await mapped_to_issuer(self._session, self._tenant_id, issuer)
        if not mapped:
            return
        scopes = self._caller.scopes
        if Scope.MANAGE_TENANT not in scopes:
            raise InsufficientScope(
                f"{mapped} principal(s) of your tenant are mapped to this issuer: whoever holds "
                "its keys acts as them and reads their memories, so registering or deleting it "
                f"needs '{Scope.MANAGE_TENANT}' as well. Nothing was changed.",
                required_scope=str(Scope.MANAGE_TENANT),
            )
        lacking = ADMIN_SCOPES - scopes
        if admin and lacking:
            raise InsufficientScope(
                "An admin of your tenant (an approved external admin, a policy admin or an "
                "auditor) is mapped to this issuer, so registering or deleting it needs every "
                "admin scope, as approving the mapping does; your token lacks "
                f"{', '.join(sorted(lacking))}. Nothing was changed.",
                required_scope=sorted(lacking)[0],
            )

    def _policy(self) -> PolicyService:
        return PolicyService(
            self._session, self._caller, trusted_issuers=self._operator_issuers, facts=self._facts
        )

    def _validate(self, data: IssuerCreate) -> None:
        if data.issuer.rstrip("/") in self._reserved:
            raise IssuerReserved(
                "issuer is memgate's own or one the operator trusts for every tenant "
                "(GET /.well-known/oauth-protected-resource lists them): its tokens already "
                "work here. Register only your own identity provider. Nothing was changed."
            )
        try:
            check_url(data.issuer, allow_loopback=self._allow_loopback, what="issuer")
            check_url(data.jwks_url, allow_loopback=self._allow_loopback)
        except UrlRefused as refused:
            raise IssuerInvalid(f"{refused} Nothing was changed.") from None
        unknown = [alg for alg in data.algorithms if alg not in ALGORITHMS]
        if unknown:
            raise IssuerInvalid(
                f"algorithms may hold only {', '.join(ALGORITHMS)} (asymmetric signatures "
                f"memgate verifies); not {', '.join(unknown)}. Nothing was changed."
            )


def _taken() -> IssuerTaken:
    return IssuerTaken(
        "This issuer and audience are registered already, so a token carrying them "
        "could not tell which tenant it is for. If it is yours, GET /v1/issuers lists "
        "it; otherwise ask your IdP for an audience of your own (e.g. one naming your "
        "organisation) and register that. Nothing was changed."
    )


def _not_found(issuer_id: uuid.UUID) -> IssuerNotFound:
    return IssuerNotFound(f"No issuer {issuer_id} in your tenant.")


def _out(row: TenantIssuer) -> IssuerOut:
    return IssuerOut(
        id=row.id,
        issuer=row.issuer,
        audience=row.audience,
        jwks_url=row.jwks_url,
        algorithms=list(row.algorithms),
        require_typ=row.require_typ,
        subject_claim=row.subject_claim,
        scope_claim=row.scope_claim,
        client_id_claim=row.client_id_claim,
        created_at=row.created_at,
    )
