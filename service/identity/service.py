"""Create tenants, principals and clients. Services never commit; the caller owns the transaction.

Every lookup carries the caller's tenant (from the token): another tenant's id is simply not
found.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from service.auth.issuer import hash_secret_off_loop
from service.auth.principal import Principal as Caller
from service.auth.scopes import ADMIN_SCOPES, ALL_SCOPES, Scope
from service.calls import Facts
from service.db.base import uuid7
from service.db.models import Client, Principal, Space, Tenant
from service.db.tenancy import name_tenant
from service.identity.problems import (
    ClientNotFound,
    ExternalSubjectTaken,
    PrincipalNotFound,
    ScopeNotAllowed,
    untrusted_issuer,
)
from service.identity.schemas import (
    ClientCreate,
    ClientCreated,
    ClientOut,
    PrincipalCreate,
    PrincipalOut,
    Role,
    RoleGrant,
)
from service.issuers.repository import issuer_registered
from service.jobs.principals import refuse_job_principal
from service.policy.compile import add_own_grants, lock_policy, recompile
from service.policy.powers import working_auditors, working_policy_admins
from service.policy.problems import LastRoleHolder
from service.policy.rules import add_rules, personal_space_rules, principal_name
from service.policy.seed import bootstrap_rules
from service.policy.service import PolicyService
from service.problems import InsufficientScope

LIST_LIMIT = 500
_ROLE_SCOPES: dict[str, str] = {"auditor": Scope.READ_AUDIT, "eraser": Scope.MANAGE_ERASURE}
"""The scope each tenant role works with: granting the role hands that power out."""


class CallerScopes(Protocol):
    """What registration needs to know of the caller (a `Principal` satisfies it)."""

    @property
    def principal_id(self) -> uuid.UUID: ...

    @property
    def scopes(self) -> frozenset[str]: ...


@dataclass(frozen=True)
class SuppliedCredentials:
    """A client id and secret the operator chose (the bootstrap admin's)."""

    client_id: uuid.UUID
    secret: str = field(repr=False)


def new_client_secret() -> str:
    return "mgs_" + secrets.token_urlsafe(32)


class IdentityService:
    def __init__(
        self,
        session: AsyncSession,
        tenant_id: uuid.UUID,
        *,
        trusted_issuers: frozenset[str] = frozenset(),
        facts: Facts | None = None,
        agents_may_read_policy: bool = True,
    ) -> None:
        """`trusted_issuers`: the `iss` of the configured external issuers
        (`AuthSettings.trusted_external_issuers`); none by default, so no external mapping.
        `facts`: where the call's audit facts are noted (none for bootstrap and internal
        checks, which are not calls of their own)."""
        self._facts = facts or Facts()
        self._session = session
        self._tenant_id = tenant_id
        self._trusted_issuers = trusted_issuers
        # The tenant's `agents_may_read_policy` setting (service/tenants/settings.py).
        self._agents_may_read_policy = agents_may_read_policy

    def _policy(self, caller: Caller) -> PolicyService:
        return PolicyService(
            self._session, caller, trusted_issuers=self._trusted_issuers, facts=self._facts
        )

    async def create_principal(self, data: PrincipalCreate) -> PrincipalOut:
        # A subject of an issuer we do not verify tokens of could never log in, yet an approved
        # one counted as a working admin (red-team pass 2, F3): refuse it before writing.
        if (
            data.external_subject is not None
            and data.external_issuer not in self._trusted_issuers
            and not await issuer_registered(self._session, self._tenant_id, data.external_issuer)
        ):
            raise untrusted_issuer(len(self._trusted_issuers))
        principal = Principal(
            tenant_id=self._tenant_id,
            id=uuid7(),
            kind=data.kind,
            display_name=data.display_name,
            external_issuer=data.external_issuer if data.external_subject else None,
            external_subject=data.external_subject,
        )
        space = Space(
            tenant_id=self._tenant_id,
            id=uuid7(),
            kind="personal",
            name=f"personal:{principal.id}",
            owner_id=principal.id,
        )
        try:
            async with self._session.begin_nested():
                self._session.add(principal)
                await self._session.flush()
                self._session.add(space)
                await self._session.flush()
        except IntegrityError:
            raise ExternalSubjectTaken(
                "Another principal already maps this external issuer and subject."
            ) from None
        await lock_policy(self._session, self._tenant_id)
        await add_rules(
            self._session,
            self._tenant_id,
            personal_space_rules(principal.kind, principal.id, space.id),
        )
        own = (principal.id, principal_name(principal.kind, principal.id))
        await add_own_grants(self._session, self._tenant_id, own, space.id)
        await self._session.refresh(principal)
        self._facts.add_targets([principal.id])
        return _principal_out(principal, space.id)

    async def get_principal(self, principal_id: uuid.UUID) -> PrincipalOut:
        row = await self._session.get(Principal, (self._tenant_id, principal_id))
        if row is None:
            raise PrincipalNotFound(f"No principal {principal_id} in your tenant.")
        return _principal_out(row, await self._personal_space(row.id))

    async def grant_role(self, caller: Caller, principal_id: uuid.UUID, role: Role) -> RoleGrant:
        """Idempotent: granting a role the principal holds changes nothing but the policy
        version. Nobody hands out a power they lack: the auditor role takes a caller holding
        `read:audit`. The role is a Casbin line (`g, <principal>, role:auditor`), compiled and
        versioned like every membership, under the tenant's policy lock."""
        if await self._session.get(Principal, (self._tenant_id, principal_id)) is None:
            raise PrincipalNotFound(f"No principal {principal_id} in your tenant.")
        if _ROLE_SCOPES[role] not in caller.scopes:
            raise InsufficientScope(
                f"Granting the '{role}' role needs the '{_ROLE_SCOPES[role]}' scope it works "
                "with: nobody hands out more than they have.",
                required_scope=_ROLE_SCOPES[role],
            )
        await self._policy(caller).set_tenant_role(principal_id, role, member=True)
        return RoleGrant(principal_id=principal_id, role=role)

    async def revoke_role(self, caller: Caller, principal_id: uuid.UUID, role: Role) -> None:
        """Idempotent too; an unknown principal answers 404 like everywhere else. Nobody takes
        the role from a principal whose admin powers exceed their own, and the tenant's last
        auditor keeps it (nobody could read the audit log any more). The tenant's policy lock
        serialises concurrent removals, so two of them cannot each see another auditor left
        and together remove the last two; the caller's admin grant and credentials are checked
        again under it."""
        if await self._session.get(Principal, (self._tenant_id, principal_id)) is None:
            raise PrincipalNotFound(f"No principal {principal_id} in your tenant.")
        await self._policy(caller).set_tenant_role(principal_id, role, member=False)

    async def list_principals(self) -> list[PrincipalOut]:
        rows = await self._session.execute(
            select(Principal, Space.id)
            .outerjoin(
                Space,
                (Space.tenant_id == Principal.tenant_id)
                & (Space.owner_id == Principal.id)
                & (Space.kind == "personal"),
            )
            .where(Principal.tenant_id == self._tenant_id)
            .order_by(Principal.id)
            .limit(LIST_LIMIT)
        )
        items = [_principal_out(principal, space_id) for principal, space_id in rows.all()]
        self._facts.count(len(items))
        return items

    async def create_client(
        self,
        caller: CallerScopes,
        data: ClientCreate,
        *,
        supplied: SuppliedCredentials | None = None,
    ) -> ClientCreated:
        """Register a client. Three ceilings: the scopes must be ones the caller's own token
        holds; admin clients and admin scopes only for users and services, never agents; and a
        client acting as *another* principal (its holder reads that principal's memories) needs
        `manage:tenant` on top of `manage:policy`. `supplied`: the operator's id and secret (the
        bootstrap admin's, MEMGATE_BOOTSTRAP_ADMIN_*) instead of random ones."""
        scopes = _checked_scopes(data.kind, data.scopes)
        target = await self._session.get(Principal, (self._tenant_id, data.principal_id))
        if target is None:
            raise PrincipalNotFound(f"No principal {data.principal_id} in your tenant.")
        _check_registration(caller, target, scopes, data.kind, self._agents_may_read_policy)
        secret = new_client_secret() if supplied is None else supplied.secret
        client = Client(
            tenant_id=self._tenant_id,
            client_id=uuid.uuid4() if supplied is None else supplied.client_id,
            principal_id=data.principal_id,
            kind=data.kind,
            name=data.name,
            secret_hash=await hash_secret_off_loop(secret),
            allowed_scopes=sorted(scopes),
        )
        self._session.add(client)
        await self._session.flush()
        await self._session.refresh(client)
        self._facts.add_targets([client.client_id])
        return ClientCreated(client=_client_out(client), client_secret=secret)

    async def get_client(self, client_id: uuid.UUID) -> ClientOut:
        row = await self._session.get(Client, (self._tenant_id, client_id))
        if row is None:
            raise ClientNotFound(f"No client {client_id} in your tenant.")
        return _client_out(row)

    async def list_clients(self) -> list[ClientOut]:
        rows = await self._session.scalars(
            select(Client)
            .where(Client.tenant_id == self._tenant_id)
            .order_by(Client.created_at, Client.client_id)
            .limit(LIST_LIMIT)
        )
        items = [_client_out(row) for row in rows.all()]
        self._facts.count(len(items))
        return items

    async def set_client_enabled(
        self, caller: Caller, client_id: uuid.UUID, *, enabled: bool
    ) -> ClientOut:
        """Disable or re-enable a client. Disabling is protective: any policy admin may stop a
        client unless it holds an admin scope the caller lacks (a lower admin cannot lock out a
        higher one), or unless it is the last working admin client of the tenant's policy
        admins (nobody could manage access again). Re-enabling hands working credentials back,
        so it takes the ceilings of registration: every scope of the client held by the caller,
        and `manage:tenant` for a client acting as another user or service. Idempotent."""
        # Under the tenant's policy lock, like every change of who may administer it: two
        # admins disabling each other's clients at once both passed the route guard, and each
        # saw the other's client still working (red-team finding 3).
        await self._policy(caller).lock_and_recheck()
        row = await self._session.get(Client, (self._tenant_id, client_id), with_for_update=True)
        if row is None:
            raise ClientNotFound(f"No client {client_id} in your tenant.")
        outranking = (set(row.allowed_scopes) & ADMIN_SCOPES) - caller.scopes
        if outranking:
            raise InsufficientScope(
                "This client holds admin scopes your token lacks "
                f"({', '.join(sorted(outranking))}); only a caller holding all of them may "
                f"{'enable' if enabled else 'disable'} it.",
                required_scope=sorted(outranking)[0],
            )
        if enabled:
            target = await self._session.get(Principal, (self._tenant_id, row.principal_id))
            assert target is not None  # foreign key
            _check_registration(
                caller, target, set(row.allowed_scopes), row.kind, self._agents_may_read_policy
            )
            row.disabled_at = None
        elif row.disabled_at is None:
            had_auditors = await self._auditors_through(row)
            row.disabled_at = datetime.now(UTC)
            await self._session.flush()
            await self._keep_role_holders(row, had_auditors=had_auditors)
        await self._session.flush()
        return _client_out(row)

    async def _auditors_through(self, row: Client) -> int:
        """Working auditors before `row` is disabled, when it could be one's credential (a
        tenant that has none already may still disable clients)."""
        if row.kind != "admin" or Scope.READ_AUDIT not in row.allowed_scopes:
            return 0
        return await working_auditors(self._session, self._tenant_id, self._trusted_issuers)

    async def _keep_role_holders(self, row: Client, *, had_auditors: int) -> None:
        """After `row` was disabled (flushed): refuse if that took the tenant's last working
        policy admin or auditor credential (the transaction then rolls back)."""
        if row.kind != "admin":
            return
        if Scope.MANAGE_POLICY in row.allowed_scopes and not await working_policy_admins(
            self._session, self._tenant_id, self._trusted_issuers
        ):
            raise LastRoleHolder(
                f"Client {row.client_id} is the last working admin client of your tenant's "
                "policy admins: disabling it would leave nobody able to manage access, and "
                "nothing in the API could undo it. Nothing was changed. Register an admin "
                "client with manage:policy for another policy admin (or add one) first."
            )
        if had_auditors and not await working_auditors(
            self._session, self._tenant_id, self._trusted_issuers
        ):
            raise LastRoleHolder(
                f"Client {row.client_id} is the last working admin client of your tenant's "
                "auditors: disabling it would leave nobody able to read the audit log. Nothing "
                "was changed. Register an admin client with read:audit for another auditor (or "
                "grant the auditor role to someone who has one) first."
            )

    async def _personal_space(self, principal_id: uuid.UUID) -> uuid.UUID | None:
        found: uuid.UUID | None = await self._session.scalar(
            select(Space.id).where(
                Space.tenant_id == self._tenant_id,
                Space.owner_id == principal_id,
                Space.kind == "personal",
            )
        )
        return found


def _check_registration(
    caller: CallerScopes,
    target: Principal,
    scopes: set[str],
    kind: str,
    agents_may_read_policy: bool = True,
) -> None:
    """Who may hand out working credentials for `target` (registering, or re-enabling)."""
    refuse_job_principal(target.tenant_id, target.id, "get a client")
    missing = scopes - caller.scopes
    if missing:
        raise ScopeNotAllowed(
            "You can only hand out scopes your own token holds; missing: "
            f"{', '.join(sorted(missing))}."
        )
    if target.kind == "agent" and (kind == "admin" or scopes & ADMIN_SCOPES):
        raise ScopeNotAllowed("Principal is an agent: agents never get admin clients or scopes.")
    if target.kind == "agent" and Scope.READ_POLICY in scopes and not agents_may_read_policy:
        raise ScopeNotAllowed(
            f"Your tenant's settings keep '{Scope.READ_POLICY}' from agents "
            "(agents_may_read_policy is false): register the client without it."
        )
    if target.id != caller.principal_id and Scope.MANAGE_TENANT not in caller.scopes:
        raise InsufficientScope(
            "Credentials that act as another principal need the "
            f"'{Scope.MANAGE_TENANT}' scope as well: their holder reads that principal's "
            "memories.",
            required_scope=str(Scope.MANAGE_TENANT),
        )


def _checked_scopes(kind: str, requested: list[str]) -> set[str]:
    scopes = set(requested)
    unknown = scopes - ALL_SCOPES
    if unknown:
        raise ScopeNotAllowed(
            f"Unknown scopes: {', '.join(sorted(unknown))}. Known: {', '.join(sorted(ALL_SCOPES))}."
        )
    if kind == "agent" and scopes & ADMIN_SCOPES:
        raise ScopeNotAllowed(
            "Admin scopes are never granted to agent clients: "
            f"{', '.join(sorted(scopes & ADMIN_SCOPES))}. Register an admin client instead."
        )
    return scopes


def _principal_out(row: Principal, space_id: uuid.UUID | None) -> PrincipalOut:
    return PrincipalOut(
        id=row.id,
        kind=row.kind,
        display_name=row.display_name,
        personal_space_id=space_id,
        external_issuer=row.external_issuer,
        external_subject=row.external_subject,
        created_at=row.created_at,
        disabled_at=row.disabled_at,
    )


def _client_out(row: Client) -> ClientOut:
    return ClientOut(
        client_id=row.client_id,
        principal_id=row.principal_id,
        name=row.name,
        kind=row.kind,
        scopes=list(row.allowed_scopes),
        created_at=row.created_at,
        disabled_at=row.disabled_at,
    )


@dataclass(frozen=True)
class _Founder:
    """The caller of the very first registration: the tenant's own admin, holding everything."""

    principal_id: uuid.UUID
    scopes: frozenset[str]


NameFor = Callable[[uuid.UUID], Awaitable[None]]
"""Names the tenant the transaction works in from now on (row-level security)."""


@dataclass(frozen=True)
class BootstrapResult:
    tenant_id: uuid.UUID
    admin_principal_id: uuid.UUID
    client_id: uuid.UUID
    client_secret: str


async def create_tenant(
    session: AsyncSession,
    name: str,
    *,
    platform: bool = False,
    settings: dict[str, Any] | None = None,
    name_for: NameFor | None = None,
    admin_credentials: SuppliedCredentials | None = None,
) -> BootstrapResult:
    """A tenant with an admin user and an admin client holding every scope. `platform`: the
    platform tenant (the first start's; at most one). `settings`: already validated
    (service/tenants/settings.py).

    Row-level security lets only a transaction naming the platform tenant insert a tenant, or
    any before there is a platform tenant (the first start). So the platform tenant names
    itself first; any other is inserted while the transaction still names its caller (the
    platform admin's call), and is named after. Its rows are then written under row-level
    security keyed on the tenant the transaction names; a caller that goes on names itself
    again. `name_for`: how the transaction names a tenant (a call's `name_for`, so its
    savepoints keep naming the new tenant); default: for this transaction only.
    `admin_credentials`: the admin client's id and secret, chosen by the operator."""

    async def work_in(tenant_id: uuid.UUID) -> None:
        if name_for is not None:
            await name_for(tenant_id)
        else:
            await name_tenant(session, tenant_id)

    tenant = Tenant(
        tenant_id=uuid.uuid4(), name=name, is_platform=platform, settings=settings or {}
    )
    session.add(tenant)
    if platform:
        await work_in(tenant.tenant_id)
    await session.flush()
    await work_in(tenant.tenant_id)
    identity = IdentityService(session, tenant.tenant_id)
    admin = await identity.create_principal(PrincipalCreate(kind="user", display_name="admin"))
    founder = _Founder(admin.id, ALL_SCOPES)
    # The seed makes the admin a policy admin and the tenant's first auditor.
    await lock_policy(session, tenant.tenant_id)
    await add_rules(session, tenant.tenant_id, bootstrap_rules(f"user:{admin.id}"))
    await recompile(session, tenant.tenant_id)
    created = await identity.create_client(
        founder,
        ClientCreate(
            principal_id=admin.id, name="bootstrap-admin", kind="admin", scopes=sorted(ALL_SCOPES)
        ),
        supplied=admin_credentials,
    )
    return BootstrapResult(
        tenant_id=tenant.tenant_id,
        admin_principal_id=admin.id,
        client_id=created.client.client_id,
        client_secret=created.client_secret,
    )


async def any_tenant(session: AsyncSession) -> bool:
    """Whether the first start's bootstrap ran (there is a platform tenant). Row-level
    security hides every tenant row before one is named: a SECURITY DEFINER function answers
    this one boolean (migration 20261201_tenants_lifecycle)."""
    return bool(await session.scalar(select(func.memgate_platform_exists())))
