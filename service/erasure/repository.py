"""The erasure's statements. What an erasure reaches spans every space of the tenant, so it is
read and removed by the SECURITY DEFINER functions of migration 20261203_erasure, which act only
on the plan named in the transaction's tenant; this module calls them and reads the plans."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.models import ErasurePlan
from service.shredding import key_slot, vault_of

ERASED_WHY = ("id", "subject", "owner", "version", "derived")
"""Why a row is erased (the reach's labels); `mention` rows are for review only."""

_REACH = text("SELECT memory_id, space_id, version, why FROM memgate_erasure_reach(:plan)")
_VALUES = text("SELECT memory_id, value, embedding FROM memgate_erasure_values(:plan)")
_SEALED = text(
    "SELECT memory_id, owner_id, value_key, value_sealed FROM memgate_erasure_sealed(:plan)"
)
_SEALED_MENTIONS = text(
    "SELECT tenant_id, memory_id, space_id, version, owner_id, value_key, value_sealed "
    "FROM memgate_erasure_sealed_mentions(:plan)"
)
_NEAREST = text(
    "SELECT ord, memory_id, similarity FROM memgate_erasure_nearest("
    "CAST(:exclude AS uuid[]), CAST(:vectors AS text[])) ORDER BY ord"
)
_EXECUTE = text("SELECT layer, erased FROM memgate_erasure_execute(:plan)")
_LEFT = text(
    "SELECT rows_left, owned_left, vectors_left, dangling FROM memgate_erasure_left("
    "CAST(:ids AS uuid[]), CAST(:owners AS uuid[]))"
)
_TENANT_NEEDLES = text("SELECT value FROM memgate_tenant_needles(:tenant, :limit)")
_ERASE_TENANT = text("SELECT layer, erased FROM memgate_erase_tenant(:tenant, :drop_audit)")
_TENANT_LEFT = text("SELECT table_name, rows_left FROM memgate_tenant_left(:tenant)")
_EXISTING_PRINCIPALS = text(
    "SELECT id FROM principals WHERE tenant_id = :tenant AND id = ANY (CAST(:ids AS uuid[]))"
)


@dataclass(frozen=True)
class Reached:
    memory_id: uuid.UUID
    space_id: uuid.UUID
    version: int
    why: str


@dataclass(frozen=True)
class Needle:
    """An erased row's text and vector, held in the process during the execution only."""

    memory_id: uuid.UUID
    value: str
    embedding: str | None
    sealed_by: uuid.UUID | None = None
    """A sealed row's key slot (its owner, or the row itself for a job's summary:
    `service.shredding.key_slot`); None: stored as text."""


@dataclass(frozen=True)
class _Sealed:
    tenant_id: uuid.UUID
    owner_id: uuid.UUID
    id: uuid.UUID
    value_key: uuid.UUID | None
    value_sealed: bytes | None


@dataclass(frozen=True)
class Left:
    rows: int
    owned: int
    vectors: int
    dangling: int


async def reach(session: AsyncSession, plan_id: uuid.UUID) -> list[Reached]:
    rows = await session.execute(_REACH, {"plan": plan_id})
    found = [Reached(row.memory_id, row.space_id, row.version, row.why) for row in rows]
    found.extend(await _sealed_mentions(session, plan_id))
    return sorted(found, key=lambda one: (one.why, str(one.memory_id)))


async def _sealed_mentions(session: AsyncSession, plan_id: uuid.UUID) -> list[Reached]:
    """The mention scan over sealed rows (crypto-shredding): opened here, matched as the SQL
    scan matches (a name as a case-insensitive substring); nothing when the plan has no
    names. Every live sealed row of the tenant is opened: its cost grows with the tenant."""
    candidates = list(await session.execute(_SEALED_MENTIONS, {"plan": plan_id}))
    if not candidates:
        return []
    names = await session.scalar(
        select(ErasurePlan.names).where(
            ErasurePlan.tenant_id == candidates[0].tenant_id, ErasurePlan.id == plan_id
        )
    )
    lowered = [name.lower() for name in names or []]
    sealed = [
        _Sealed(row.tenant_id, row.owner_id, row.memory_id, row.value_key, bytes(row.value_sealed))
        for row in candidates
    ]
    plain = await vault_of(session).plaintexts(sealed)
    return [
        Reached(row.memory_id, row.space_id, row.version, "mention")
        for row in candidates
        if any(name in plain.get(row.memory_id, "").lower() for name in lowered)
    ]


def fingerprint(reached: Sequence[Reached]) -> bytes:
    """What execution re-checks: the erased rows and their versions (mentions aside: the
    review list may change without changing what is erased)."""
    erased = sorted(f"{one.memory_id}:{one.version}" for one in reached if one.why != "mention")
    return hashlib.sha256("\n".join(erased).encode()).digest()


async def needles(session: AsyncSession, tenant_id: uuid.UUID, plan_id: uuid.UUID) -> list[Needle]:
    """The erased rows' text (a sealed row's opened with its owner's key, still there before
    the execution) and vectors."""
    sealed = {
        row.memory_id: _Sealed(
            tenant_id, row.owner_id, row.memory_id, row.value_key, bytes(row.value_sealed)
        )
        for row in await session.execute(_SEALED, {"plan": plan_id})
    }
    plain = await vault_of(session).plaintexts(sealed.values())
    rows = await session.execute(_VALUES, {"plan": plan_id})
    return [
        Needle(
            row.memory_id,
            plain.get(row.memory_id, row.value),
            row.embedding,
            key_slot(one.owner_id, one.id, one.value_key)
            if (one := sealed.get(row.memory_id)) is not None
            else None,
        )
        for row in rows
    ]


async def nearest(
    session: AsyncSession, exclude: Sequence[uuid.UUID], vectors: Sequence[str]
) -> list[tuple[int, uuid.UUID, float]]:
    if not vectors:
        return []
    rows = await session.execute(_NEAREST, {"exclude": list(exclude), "vectors": list(vectors)})
    return [(int(row.ord), row.memory_id, float(row.similarity)) for row in rows]


async def execute(session: AsyncSession, plan_id: uuid.UUID) -> dict[str, int]:
    rows = await session.execute(_EXECUTE, {"plan": plan_id})
    return {row.layer: int(row.erased) for row in rows}


async def left(
    session: AsyncSession, ids: Sequence[uuid.UUID], owners: Sequence[uuid.UUID]
) -> Left:
    row = (await session.execute(_LEFT, {"ids": list(ids), "owners": list(owners)})).one()
    return Left(int(row.rows_left), int(row.owned_left), int(row.vectors_left), int(row.dangling))


async def missing_principals(
    session: AsyncSession, tenant_id: uuid.UUID, ids: Sequence[uuid.UUID]
) -> list[uuid.UUID]:
    found = set(
        (await session.scalars(_EXISTING_PRINCIPALS, {"tenant": tenant_id, "ids": list(ids)})).all()
    )
    return [one for one in ids if one not in found]


async def plan(
    session: AsyncSession, tenant_id: uuid.UUID, plan_id: uuid.UUID, *, lock: bool = False
) -> ErasurePlan | None:
    statement = select(ErasurePlan).where(
        ErasurePlan.tenant_id == tenant_id, ErasurePlan.id == plan_id
    )
    if lock:
        statement = statement.with_for_update()
    found: ErasurePlan | None = await session.scalar(
        statement.execution_options(populate_existing=True)
    )
    return found


async def tenant_needles(session: AsyncSession, tenant_id: uuid.UUID, limit: int) -> list[str]:
    rows = await session.scalars(_TENANT_NEEDLES, {"tenant": tenant_id, "limit": limit})
    return list(rows)


async def erase_tenant(
    session: AsyncSession, tenant_id: uuid.UUID, *, drop_audit: bool
) -> dict[str, int]:
    rows = await session.execute(_ERASE_TENANT, {"tenant": tenant_id, "drop_audit": drop_audit})
    return {row.layer: int(row.erased) for row in rows}


async def tenant_left(session: AsyncSession, tenant_id: uuid.UUID) -> dict[str, int]:
    rows = await session.execute(_TENANT_LEFT, {"tenant": tenant_id})
    return {row.table_name: int(row.rows_left) for row in rows}


async def tenant_erasure(
    session: AsyncSession, platform_id: uuid.UUID, tenant_id: uuid.UUID
) -> ErasurePlan | None:
    found: ErasurePlan | None = await session.scalar(
        select(ErasurePlan)
        .where(ErasurePlan.tenant_id == platform_id, ErasurePlan.erased_tenant == tenant_id)
        .order_by(ErasurePlan.executed_at.desc())
        .limit(1)
    )
    return found
