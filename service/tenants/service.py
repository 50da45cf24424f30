"""The tenant lifecycle, as the platform admin runs it. Services never commit (the call does).

Every read and write here runs in a transaction naming the platform tenant, whose row-level
security shows every `tenants` row and no other tenant's data: creating a tenant names the new
one while its first rows are written and names the platform tenant again before the call's
audit row (`create`); a deletion counts and removes the other tenant's rows only through the
two SECURITY DEFINER functions of migration 20261201_tenants_lifecycle.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
import uuid
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime
from typing import Any, Protocol

from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncSession

from service.calls import Facts
from service.db.models import Client, Tenant
from service.identity.problems import ClientNotFound
from service.identity.service import create_tenant
from service.memory.service import decode_cursor, encode_cursor
from service.problems import InvalidRequest
from service.quotas import service as quotas
from service.quotas.schemas import Limits
from service.settings import MemorySettings
from service.shredding import vault_of
from service.tenants.problems import (
    ConfirmationInvalid,
    PlatformTenantLocked,
    TenantNotDisabled,
    TenantNotFound,
    TenantSettingsInvalid,
)
from service.tenants.schemas import (
    DeletionCounts,
    DeletionPlan,
    TenantAdmin,
    TenantCreate,
    TenantCreated,
    TenantLimits,
    TenantOut,
    TenantPage,
    TenantUpdate,
    TenantUsage,
)
from service.tenants.settings import SettingsInvalid, merged

CONFIRM_SECONDS = 600
"""How long a deletion plan's confirmation value holds."""
KEEPS = [
    "audit chain (content-free; `audit=drop` deletes it too), its pseudonyms unresolvable",
    "tenant id (retired, never reused)",
]
_PLAN = text(
    "SELECT memory_count, space_count, principal_count, client_count, policy_rule_count, "
    "audit_row_count FROM memgate_tenant_plan(:tenant)"
)


class PlatformCaller(Protocol):
    """What the lifecycle needs of the platform admin's call (a `Call` is one)."""

    async def name_for(self, tenant_id: uuid.UUID | None) -> None:
        """Name `tenant_id` for what follows; None: the caller's own tenant again."""

    def working_in(self, tenant_id: uuid.UUID) -> AbstractAsyncContextManager[None]:
        """`name_for(tenant_id)` for a block, the caller's own tenant again after it."""


class TenantEraser(Protocol):
    """How a confirmed deletion erases the tenant (service/erasure: one transaction, a signed
    receipt kept in the platform tenant, the files scanned and VACUUMed)."""

    async def __call__(self, tenant_id: uuid.UUID) -> tuple[uuid.UUID, str]:
        """Erase every row of the tenant; (the erasure's id, its signed receipt)."""


class TenantService:
    def __init__(
        self,
        session: AsyncSession,
        caller: PlatformCaller,
        limits: MemorySettings,
        deletion_key: bytes,
        *,
        facts: Facts,
        eraser: TenantEraser | None = None,
    ) -> None:
        """`limits`: the operator's memory limits, which tenant settings may only tighten.
        `deletion_key`: the key deletion confirmations are MACed with (`deletion_key()`).
        `eraser`: what carries out a confirmed deletion (the DELETE route gives it)."""
        self._eraser = eraser
        self._session = session
        self._caller = caller
        self._limits = limits
        self._key = deletion_key
        self._facts = facts

    async def create(self, data: TenantCreate) -> TenantCreated:
        settings = self._settings({}, data.settings or {})
        created = await create_tenant(
            self._session, data.name, settings=settings, name_for=self._caller.name_for
        )
        # create_tenant named the new tenant for its rows; the call's audit row goes to the
        # platform chain, which appends only for the tenant the transaction names.
        await self._caller.name_for(None)
        self._facts.add_targets([created.tenant_id])
        return TenantCreated(
            tenant=_out(await self._row(created.tenant_id)),
            admin=TenantAdmin(
                principal_id=created.admin_principal_id,
                client_id=created.client_id,
                client_secret=created.client_secret,
            ),
        )

    async def list_page(self, cursor: str | None, limit: int | None) -> TenantPage:
        size = min(50, self._limits.max_page_size) if limit is None else limit
        if not 1 <= size <= self._limits.max_page_size:
            raise InvalidRequest(
                f"'limit' must be between 1 and {self._limits.max_page_size}; got {size}.",
                errors=[{"field": "limit", "message": "out of range"}],
            )
        statement = select(Tenant).where(Tenant.retired_at.is_(None))
        if cursor:
            statement = statement.where(Tenant.tenant_id > decode_cursor(cursor))
        rows = list(
            await self._session.scalars(statement.order_by(Tenant.tenant_id).limit(size + 1))
        )
        page = rows[:size]
        self._facts.add_targets(row.tenant_id for row in page)
        self._facts.count(len(page))
        more = len(rows) > size
        return TenantPage(
            items=[_out(row) for row in page],
            next_cursor=encode_cursor(page[-1].tenant_id) if more else None,
        )

    async def get(self, tenant_id: uuid.UUID) -> TenantOut:
        return _out(await self._row(tenant_id))

    async def get_any(self, tenant_id: uuid.UUID) -> None:
        """The tenant exists, retired (deleted) or not: 404 otherwise."""
        found = await self._session.scalar(
            select(Tenant.tenant_id).where(Tenant.tenant_id == tenant_id)
        )
        if found is None:
            raise TenantNotFound(f"No tenant {tenant_id}.")
        self._facts.add_targets([tenant_id])

    async def limits(self, tenant_id: uuid.UUID) -> TenantLimits:
        await self._row(tenant_id)
        async with self._caller.working_in(tenant_id):
            every = await quotas.all_limits_of(self._session, tenant_id)
            memories, size = await quotas.counted_usage(self._session, tenant_id)
        own = every.pop(quotas.TENANT_SCOPE, Limits())
        return TenantLimits(
            tenant=own, clients=every, usage=TenantUsage(memories=memories, bytes=size)
        )

    async def set_limits(
        self, tenant_id: uuid.UUID, limits: Limits, client_id: uuid.UUID | None = None
    ) -> Limits:
        """Only the platform admin sets quotas: a tenant admin cannot raise its own."""
        await self._row(tenant_id)
        async with self._caller.working_in(tenant_id):
            if client_id is not None:
                if await self._session.get(Client, (tenant_id, client_id)) is None:
                    raise ClientNotFound(f"No client {client_id} in tenant {tenant_id}.")
                self._facts.add_targets([client_id])
            scope = None if client_id is None else str(client_id)
            return await quotas.set_limits(self._session, tenant_id, limits, scope)

    async def update(self, tenant_id: uuid.UUID, data: TenantUpdate) -> TenantOut:
        row = await self._row(tenant_id, lock=True)
        if data.settings is not None:
            row.settings = self._settings(row.settings, data.settings)
        if data.name is not None:
            row.name = data.name
        return await self._saved(row)

    async def disable(self, tenant_id: uuid.UUID) -> TenantOut:
        row = await self._row(tenant_id, lock=True)
        if row.is_platform:
            raise PlatformTenantLocked(
                "The platform tenant cannot be disabled: its admins are the only ones who could "
                "enable it again. Nothing was changed."
            )
        if row.disabled_at is None:  # idempotent: the first disable's time stays
            row.disabled_at = datetime.now(UTC)
        return await self._saved(row)

    async def enable(self, tenant_id: uuid.UUID) -> TenantOut:
        row = await self._row(tenant_id, lock=True)
        row.disabled_at = None
        return await self._saved(row)

    async def delete(self, tenant_id: uuid.UUID, confirm: str | None) -> DeletionPlan:
        """Without `confirm`: the plan, changing nothing. With the plan's value: carried out."""
        row = await self._row(tenant_id, lock=True)
        if row.is_platform:
            raise PlatformTenantLocked(
                "The platform tenant cannot be deleted (the owner-lockout rule). Nothing was "
                "changed."
            )
        counts = await self._counts(tenant_id)
        disabled = row.disabled_at is not None
        if confirm is None:
            return self._plan(tenant_id, counts, row.disabled_at)
        if not disabled:
            raise TenantNotDisabled(
                f"Disable the tenant first (POST /v1/tenants/{tenant_id}/disable), then ask "
                "DELETE again for a fresh plan. Nothing was changed."
            )
        if not self._confirmed(tenant_id, counts, row.disabled_at, confirm):
            raise ConfirmationInvalid(
                "The 'confirm' value is not this tenant's current plan: it expired, or what the "
                "plan counted has changed. Ask DELETE without 'confirm' for a fresh plan. "
                "Nothing was changed."
            )
        if self._eraser is None:
            raise TypeError("a confirmed deletion needs the eraser")
        erasure_id, receipt = await self._eraser(tenant_id)
        self._facts.count(counts.memories)
        plan = self._plan(tenant_id, counts, row.disabled_at)
        plan.confirm, plan.expires_at, plan.deleted = None, None, True
        plan.erasure_id, plan.receipt = erasure_id, receipt
        return plan

    def _plan(
        self, tenant_id: uuid.UUID, counts: DeletionCounts, disabled_at: datetime | None
    ) -> DeletionPlan:
        disabled = disabled_at is not None
        expires = int(time.time()) + CONFIRM_SECONDS
        return DeletionPlan(
            tenant_id=tenant_id,
            disabled=disabled,
            removes=counts,
            keeps=list(KEEPS),
            confirm=self._confirmation(tenant_id, counts, disabled_at, expires)
            if disabled
            else None,
            expires_at=datetime.fromtimestamp(expires, UTC) if disabled else None,
        )

    def _confirmation(
        self,
        tenant_id: uuid.UUID,
        counts: DeletionCounts,
        disabled_at: datetime | None,
        expires: int,
    ) -> str:
        # Bound to the tenant, to the disabling it was asked under (a value from before the
        # tenant was enabled and disabled again must not carry out the later one: red-team
        # finding), to what the plan counted (not the audit rows, which are kept) and to its
        # expiry: a value is good for this plan only, for a few minutes.
        bound = [
            str(tenant_id),
            disabled_at.isoformat() if disabled_at is not None else "",
            str(expires),
            *(str(n) for n in (counts.memories, counts.spaces, counts.principals)),
            *(str(n) for n in (counts.clients, counts.policy_rules)),
        ]
        mac = hmac.new(self._key, "|".join(bound).encode(), hashlib.sha256).digest()
        return f"{expires}.{base64.urlsafe_b64encode(mac).decode().rstrip('=')}"

    def _confirmed(
        self,
        tenant_id: uuid.UUID,
        counts: DeletionCounts,
        disabled_at: datetime | None,
        confirm: str,
    ) -> bool:
        expires_text, _, _ = confirm[:100].partition(".")
        if not expires_text.isdigit() or int(expires_text) < time.time():
            return False
        expected = self._confirmation(tenant_id, counts, disabled_at, int(expires_text))
        return hmac.compare_digest(expected.encode(), confirm[:100].encode())

    async def _counts(self, tenant_id: uuid.UUID) -> DeletionCounts:
        row = (await self._session.execute(_PLAN, {"tenant": str(tenant_id)})).one()
        return DeletionCounts(
            memories=row.memory_count,
            spaces=row.space_count,
            principals=row.principal_count,
            clients=row.client_count,
            policy_rules=row.policy_rule_count,
            audit_rows=row.audit_row_count,
        )

    def _settings(self, current: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
        try:
            result = merged(current, change, self._limits)
        except SettingsInvalid as exc:
            raise TenantSettingsInvalid(
                f"{exc} Allowed: {exc.allowed}. Nothing was changed.",
                field=exc.field,
                allowed=exc.allowed,
            ) from None
        refusal = vault_of(self._session).refusal() if change.get("crypto_shredding") else None
        if refusal is not None:
            raise TenantSettingsInvalid(
                f"'settings.crypto_shredding' cannot be turned on: {refusal}. Nothing was changed.",
                field="settings.crypto_shredding",
                allowed="false (until a shared data key store is configured)",
            )
        return result

    async def _row(self, tenant_id: uuid.UUID, *, lock: bool = False) -> Tenant:
        statement = select(Tenant).where(Tenant.tenant_id == tenant_id, Tenant.retired_at.is_(None))
        if lock:
            statement = statement.with_for_update()
        row = await self._session.scalar(statement.execution_options(populate_existing=True))
        if row is None:
            raise TenantNotFound(f"No tenant {tenant_id}.")
        self._facts.add_targets([tenant_id])
        return row

    async def _saved(self, row: Tenant) -> TenantOut:
        row.updated_at = datetime.now(UTC)
        await self._session.flush()
        await self._session.refresh(row)
        return _out(row)


def deletion_key(raw: bytes) -> bytes:
    """The deletion confirmations' MAC key, derived from the key-encryption key the service
    already holds (a key of its own purpose: a MAC made with it opens nothing else)."""
    return hmac.new(raw, b"memgate/tenant-deletion/v1", hashlib.sha256).digest()


def _out(row: Tenant) -> TenantOut:
    return TenantOut(
        tenant_id=row.tenant_id,
        name=row.name,
        is_platform=row.is_platform,
        created_at=row.created_at,
        updated_at=row.updated_at,
        disabled_at=row.disabled_at,
        settings=dict(row.settings),
    )
