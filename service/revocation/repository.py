"""Revocations and the hidden state they materialise (migration 20261202_revocation).

The one read of a memory row here starts from the caller's `Visible` (`target`); the causes
of a write's hiding are looked up in `revocations` and `memory_hidings`, and the tenant-wide
hiding and lifting are the database's
`memgate_revocation_hide` / `memgate_revocation_lift` (they must reach rows the revoker cannot
read; see the migration).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

from sqlalchemy import (
    LargeBinary,
    Select,
    Text,
    any_,
    bindparam,
    cast,
    func,
    insert,
    select,
    tuple_,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, UUID
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.driver import built_once, run
from service.db.models import ErasureTombstone, Memory, MemoryHiding, Revocation
from service.memory.repository import SEALING
from service.policy.visible import Liveness, Visible
from service.shredding import opened_value

_UUIDS = ARRAY(UUID)
_HASHES = ARRAY(LargeBinary)


def lock_name(tenant_id: uuid.UUID) -> str:
    """The advisory lock revocations and writes of a tenant meet on."""
    return f"memgate.revocations|{tenant_id}"


async def hold_out_writes(session: AsyncSession, tenant_id: uuid.UUID) -> None:
    """A revoke or reinstate: the tenant's revocation lock, exclusive, until commit. A write
    in flight (which holds it shared, `service.memory.repository.lock_keys`) is committed
    before the hiding walk reads the rows, and a write that starts later reads the revocation
    as committed: no copy or derived row slips between the walk and the write-time check."""
    await session.execute(
        select(func.pg_advisory_xact_lock(func.hashtextextended(_lock(tenant_id), 0)))
    )


def _lock(tenant_id: uuid.UUID) -> Any:
    return bindparam("revocation_lock", lock_name(tenant_id), Text)


@dataclass(frozen=True)
class Target:
    """The memory a revoke or reinstate names, as the caller's delete predicate finds it."""

    id: uuid.UUID
    space_id: uuid.UUID
    value: str
    content_hash: bytes
    hidden: bool
    version: int
    """Its number in its key's chain: with the id, its ETag (an `If-Match` names it)."""


async def target(session: AsyncSession, scope: Visible, memory_id: uuid.UUID) -> Target | None:
    """Any version the caller may delete (and read), hidden ones included; not a retracted
    stub (nothing left to revoke) nor an expired one."""
    row = (
        await session.execute(
            scope.select(
                Memory.id,
                Memory.space_id,
                Memory.value,
                Memory.content_hash,
                Memory.revoked_at,
                Memory.version,
                *SEALING,
                liveness=Liveness.including_revoked(),
            ).where(Memory.id == memory_id)
        )
    ).one_or_none()
    if row is None:
        return None
    # The reason's quote check needs the text: a sealed row's, opened.
    value = await opened_value(session, row)
    return Target(row[0], row[1], value, bytes(row[3]), row[4] is not None, row[5])


async def reachable(
    session: AsyncSession, scope: Visible, memory_ids: Sequence[uuid.UUID]
) -> list[uuid.UUID]:
    """Those of `memory_ids` that `scope` reaches, hidden ones included: with the delete
    predicate those the caller may revoke or reinstate, with the read one those it reads."""
    if not memory_ids:
        return []
    rows = await session.scalars(
        scope.select(Memory.id, liveness=Liveness.including_revoked())
        .where(Memory.id.in_(list(memory_ids)))
        .order_by(Memory.id)
    )
    return list(rows.all())


@dataclass(frozen=True)
class Standing:
    """A standing revocation, as its reinstatement needs it."""

    id: uuid.UUID
    memory_id: uuid.UUID
    revoked_at: datetime


async def standing_of(
    session: AsyncSession, tenant_id: uuid.UUID, memory_id: uuid.UUID
) -> Standing | None:
    row = (
        await session.execute(
            select(Revocation.id, Revocation.memory_id, Revocation.revoked_at).where(
                Revocation.tenant_id == tenant_id,
                Revocation.memory_id == memory_id,
                Revocation.reinstated_at.is_(None),
            )
        )
    ).one_or_none()
    return None if row is None else Standing(row[0], row[1], row[2])


async def revoke(
    session: AsyncSession,
    *,
    tenant_id: uuid.UUID,
    revocation_id: uuid.UUID,
    memory_id: uuid.UUID,
    space_id: uuid.UUID,
    content_hash: bytes,
    reason: str,
    revoked_by: uuid.UUID,
) -> tuple[datetime, list[uuid.UUID]]:
    """Record the revocation, then hide what it covers, tenant-wide: (its time, the ids that
    became hidden now; rows hidden already by another revocation gain a cause only)."""
    revoked_at = await session.scalar(
        insert(Revocation)
        .values(
            tenant_id=tenant_id,
            id=revocation_id,
            memory_id=memory_id,
            space_id=space_id,
            content_hash=content_hash,
            reason=reason,
            revoked_by=revoked_by,
        )
        .returning(Revocation.revoked_at)
    )
    assert revoked_at is not None
    hidden = await session.scalars(
        select(func.memgate_revocation_hide(bindparam("revocation", revocation_id, UUID)))
    )
    return revoked_at, list(hidden.all())


async def reinstate(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    revocation_id: uuid.UUID,
    *,
    reinstated_by: uuid.UUID,
    reason: str,
) -> tuple[datetime, list[uuid.UUID]]:
    """Lift the revocation: (its time, the ids that came back: those it alone hid)."""
    reinstated_at = await session.scalar(
        update(Revocation)
        .where(Revocation.tenant_id == tenant_id, Revocation.id == revocation_id)
        .values(reinstated_at=func.now(), reinstated_by=reinstated_by, reinstate_reason=reason)
        .returning(Revocation.reinstated_at)
    )
    assert reinstated_at is not None
    back = await session.scalars(
        select(func.memgate_revocation_lift(bindparam("revocation", revocation_id, UUID)))
    )
    return reinstated_at, list(back.all())


async def revoked_memories_hiding(
    session: AsyncSession, tenant_id: uuid.UUID, memory_id: uuid.UUID
) -> list[uuid.UUID]:
    """The revoked memories whose standing revocations hide `memory_id`."""
    rows = await session.scalars(
        select(Revocation.memory_id)
        .join(
            MemoryHiding,
            (MemoryHiding.tenant_id == Revocation.tenant_id)
            & (MemoryHiding.revocation_id == Revocation.id),
        )
        .where(
            MemoryHiding.tenant_id == tenant_id,
            MemoryHiding.memory_id == memory_id,
            Revocation.reinstated_at.is_(None),
        )
        .order_by(Revocation.memory_id)
    )
    return list(rows.all())


@dataclass(frozen=True)
class Causes:
    """Why writes would be born hidden: standing revocations by (space, content hash), and
    the revocations hiding each cited source."""

    by_content: dict[tuple[uuid.UUID, bytes], set[uuid.UUID]]
    by_source: dict[uuid.UUID, set[uuid.UUID]]
    erased: frozenset[tuple[uuid.UUID, bytes]] = frozenset()
    """(space, content hash) pairs an erasure keeps as tombstones (service/erasure): refused
    in that space, read in the same statement."""

    def of(
        self, space_id: uuid.UUID, content_hash: bytes, sources: Sequence[uuid.UUID]
    ) -> tuple[set[uuid.UUID], set[uuid.UUID]]:
        """(revocations of the content, revocations hiding a source) of one write."""
        content = set(self.by_content.get((space_id, content_hash), set()))
        derived: set[uuid.UUID] = set()
        for source in sources:
            derived |= self.by_source.get(source, set())
        return content, derived


@cache
def _causes_statement() -> Select[Any]:
    """`causes_of`'s statement, built once: the pairs and sources come as arrays, so its shape
    is the same whatever the batch (it runs on every write)."""
    tenant = bindparam("causes_tenant", type_=UUID)
    wanted = (
        func.unnest(bindparam("wanted_spaces", [], _UUIDS), bindparam("wanted_hashes", [], _HASHES))
        .table_valued("space_id", "content_hash")
        .render_derived(name="wanted")
    )
    by_content_rows = select(
        func.array_agg(
            func.jsonb_build_array(
                cast(Revocation.id, Text),
                cast(Revocation.space_id, Text),
                func.encode(Revocation.content_hash, "hex"),
            )
        )
    ).where(
        Revocation.tenant_id == tenant,
        Revocation.reinstated_at.is_(None),
        tuple_(Revocation.space_id, Revocation.content_hash).in_(
            select(wanted.c.space_id, wanted.c.content_hash)
        ),
    )
    by_source_rows = select(
        func.array_agg(
            func.jsonb_build_array(
                cast(MemoryHiding.memory_id, Text), cast(MemoryHiding.revocation_id, Text)
            )
        )
    ).where(
        MemoryHiding.tenant_id == tenant,
        MemoryHiding.memory_id == any_(bindparam("cited", [], _UUIDS)),
    )
    erased_rows = select(
        func.array_agg(
            func.jsonb_build_array(
                cast(ErasureTombstone.space_id, Text),
                func.encode(ErasureTombstone.content_hash, "hex"),
            )
        )
    ).where(
        ErasureTombstone.tenant_id == tenant,
        tuple_(ErasureTombstone.space_id, ErasureTombstone.content_hash).in_(
            select(wanted.c.space_id, wanted.c.content_hash)
        ),
    )
    return built_once(
        select(
            by_content_rows.scalar_subquery(),
            by_source_rows.scalar_subquery(),
            erased_rows.scalar_subquery(),
        )
    )


async def causes_of(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    contents: Sequence[tuple[uuid.UUID, bytes]],
    sources: Sequence[uuid.UUID],
) -> Causes:
    """The standing revocations that would hide writes of these (space, content hash) pairs
    or citing these sources, and the erasure tombstones among the hashes: one statement (three
    index reads), whatever the batch size."""
    wanted = sorted(set(contents))
    params = {
        "causes_tenant": tenant_id,
        "wanted_spaces": [space_id for space_id, _ in wanted],
        "wanted_hashes": [digest for _, digest in wanted],
        "cited": sorted(set(sources)),
    }
    (row,) = await run(session, _causes_statement(), params)
    by_content: dict[tuple[uuid.UUID, bytes], set[uuid.UUID]] = {}
    for revocation_id, space_id, digest in row[0] or []:
        key = (uuid.UUID(space_id), bytes.fromhex(digest))
        by_content.setdefault(key, set()).add(uuid.UUID(revocation_id))
    by_source: dict[uuid.UUID, set[uuid.UUID]] = {}
    for memory_id, revocation_id in row[1] or []:
        by_source.setdefault(uuid.UUID(memory_id), set()).add(uuid.UUID(revocation_id))
    erased = frozenset(
        (uuid.UUID(space_id), bytes.fromhex(digest)) for space_id, digest in row[2] or []
    )
    return Causes(by_content, by_source, erased)


async def note_hidden(
    session: AsyncSession, tenant_id: uuid.UUID, hidden: dict[uuid.UUID, set[uuid.UUID]]
) -> None:
    """The causes of rows written hidden (memory id -> revocation ids)."""
    values = [
        {"tenant_id": tenant_id, "memory_id": memory_id, "revocation_id": revocation_id}
        for memory_id, causes in hidden.items()
        for revocation_id in sorted(causes)
    ]
    if values:
        await session.execute(insert(MemoryHiding), values)
