"""Register, list, read and delete the external issuers of the caller's tenant. Services never
commit; the call owns the transaction.

Nothing a tenant admin registers can yield a token for another tenant: a registered issuer's
tokens always belong to the registering tenant (service/auth/tokens.py), the (issuer, audience)
pair that selects it is unique across the platform (a second registration of it is refused
with the same answer whoever holds it), and memgate's own issuer and the operator's issuers,
whose tokens name their tenant in a claim, cannot be registered at all.
"""

from __future__ import annotations

import uuid

from sqlalchemy import delete, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from service.auth.principal import Principal as Caller
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
from service.policy.powers import working_auditors, working_policy_admins
from service.policy.problems import LastRoleHolder
from service.policy.service import PolicyService

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
            raise IssuerTaken(
                "This issuer and audience are registered already, so a token carrying them "
                "could not tell which tenant it is for. If it is yours, GET /v1/issuers lists "
                "it; otherwise ask your IdP for an audience of your own (e.g. one naming your "
                "organisation) and register that. Nothing was changed."
            ) from None
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
        had_auditors = await working_auditors(
            self._session, self._tenant_id, self._operator_issuers
        )
        deleted = await self._session.execute(
            delete(TenantIssuer)
            .where(TenantIssuer.tenant_id == self._tenant_id, TenantIssuer.id == issuer_id)
            .returning(TenantIssuer.id)
        )
        if deleted.one_or_none() is None:
            raise _not_found(issuer_id)
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
