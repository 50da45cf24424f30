"""The tenant's job principal: the `service` principal every job run of the tenant runs as.

Its id is derived from the tenant's (`job_principal_id`), so the runner names it for row-level
security before reading anything, and an admin can grant it with `service:<id>` before it
exists. The row is made the first time a run is queued (`ensure_job_principal`, an idempotent
insert as the app role: no migration has to visit every tenant). It starts with no grants:
policy decides what jobs may read, write and delete, like any other principal's.

A run carries the grants its principal held when it was queued (`snapshot`); each batch runs as
`job_principal(..., within=snapshot)`, which `Visible` intersects with the grants held then.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from service.auth.principal import GrantSnapshot, Principal
from service.auth.scopes import Scope
from service.auth.tokens import CachedKeySet, TrustedIssuer, VerifiedToken
from service.db.models import Principal as PrincipalRow
from service.db.models import PrincipalRole, SpaceGrant, Tenant
from service.identity.problems import JobPrincipalReserved
from service.policy.compile import lock_policy
from service.policy.visible import Action
from service.tenants.settings import TenantSettings
from service.tenants.settings import stored as stored_tenant_settings

JOB_PRINCIPAL_NAMESPACE = uuid.UUID("6d656d67-6174-4565-9a6f-62732d6a6f62")
"""uuid5 namespace of job principal ids (fixed: changing it orphans every job grant)."""
JOB_PRINCIPAL_NAME = "jobs"
JOB_CLIENT = "memgate-jobs"
JOB_ISSUER = "memgate:jobs"
"""Named in a job batch's audit row as its issuer: no token was presented, the runner acted."""


def job_principal_id(tenant_id: uuid.UUID) -> uuid.UUID:
    return uuid.uuid5(JOB_PRINCIPAL_NAMESPACE, str(tenant_id))


def refuse_job_principal(tenant_id: uuid.UUID, principal_id: uuid.UUID, what: str) -> None:
    """Refuse handing the job principal credentials (a client, a delegation): its grants are
    used only inside a run, within the run's snapshot, never through a token."""
    if principal_id == job_principal_id(tenant_id):
        raise JobPrincipalReserved(
            f"Principal {principal_id} is your tenant's job principal: it acts only inside job "
            f"runs (POST /v1/jobs/{{name}}/runs) and cannot {what}. Register the client, or "
            "name the delegate, for a principal of its own (POST /v1/principals). Nothing "
            "was changed."
        )


async def ensure_job_principal(session: AsyncSession, tenant_id: uuid.UUID) -> uuid.UUID:
    """The job principal of `tenant_id` (the transaction names that tenant), made if missing."""
    principal_id = job_principal_id(tenant_id)
    exists = await session.scalar(
        select(PrincipalRow.id).where(
            PrincipalRow.tenant_id == tenant_id, PrincipalRow.id == principal_id
        )
    )
    if exists is not None:
        return principal_id
    # Under the policy lock, as every principal's creation: a recompile running meanwhile
    # must not rebuild the closures without it. Its own role row is all a full compile would
    # add (no rule can name it before it exists); it has no personal space (a job keeps no
    # private notes).
    await lock_policy(session, tenant_id)
    inserted = await session.execute(
        insert(PrincipalRow)
        .values(
            tenant_id=tenant_id, id=principal_id, kind="service", display_name=JOB_PRINCIPAL_NAME
        )
        .on_conflict_do_nothing(index_elements=["tenant_id", "id"])
        .returning(PrincipalRow.id)
    )
    if inserted.scalar_one_or_none() is not None:
        await session.execute(
            insert(PrincipalRole)
            .values(tenant_id=tenant_id, principal_id=principal_id, role=f"service:{principal_id}")
            .on_conflict_do_nothing()
        )
    return principal_id


async def snapshot(
    session: AsyncSession, tenant_id: uuid.UUID, principal_id: uuid.UUID
) -> GrantSnapshot:
    """The spaces `principal_id` holds each action on now (the compiled grants)."""
    rows = await session.execute(
        select(SpaceGrant.action, func.array_agg(SpaceGrant.space_id))
        .where(SpaceGrant.tenant_id == tenant_id, SpaceGrant.principal_id == principal_id)
        .group_by(SpaceGrant.action)
    )
    return GrantSnapshot.of({str(row[0]): list(row[1]) for row in rows.all()})


def snapshot_of(stored: Mapping[str, Any]) -> GrantSnapshot:
    """A run's `granted` column back as a snapshot (unknown actions and bad ids are dropped)."""
    spaces: dict[str, list[uuid.UUID]] = {}
    for action in Action:
        ids = stored.get(action.value, [])
        spaces[action.value] = [uuid.UUID(str(i)) for i in ids if _is_uuid(i)]
    return GrantSnapshot.of(spaces)


def _is_uuid(raw: object) -> bool:
    try:
        uuid.UUID(str(raw))
    except ValueError:
        return False
    return True


async def tenant_settings(session: AsyncSession, tenant_id: uuid.UUID) -> TenantSettings | None:
    """The tenant's settings, or None when it is disabled or retired (its jobs wait)."""
    row = (
        await session.execute(
            select(Tenant.settings).where(
                Tenant.tenant_id == tenant_id,
                Tenant.disabled_at.is_(None),
                Tenant.retired_at.is_(None),
            )
        )
    ).first()
    return None if row is None else stored_tenant_settings(row[0])


def job_principal(
    tenant_id: uuid.UUID,
    run_id: uuid.UUID,
    within: GrantSnapshot,
    settings: TenantSettings,
) -> Principal:
    """The principal one run's batches act as: its grants now, inside those at enqueue."""
    return Principal(
        tenant_id=tenant_id,
        principal_id=job_principal_id(tenant_id),
        client_id=JOB_CLIENT,
        scopes=frozenset({Scope.RUN_JOBS.value}),
        token_id=f"job-run:{run_id}",
        issuer=JOB_ISSUER,
        tenant_settings=settings,
        within=within,
    )


def job_token(principal: Principal, keys: CachedKeySet) -> VerifiedToken:
    """What the audit row of a batch is built from: the job principal as the caller, in its
    own tenant's chain. Nothing is signed; it never leaves the process."""
    issuer = TrustedIssuer(
        issuer=JOB_ISSUER, audience="memgate", algorithms=(), keys=keys, embedded=False
    )
    return VerifiedToken(
        issuer=issuer,
        tenant_id=principal.tenant_id,
        subject=str(principal.principal_id),
        client_id=principal.client_id,
        scopes=principal.scopes,
        token_id=principal.token_id,
        act=None,
        claims={},
    )
