"""SQL for memories. Every statement starts from a `Visible` (service.policy.visible)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.models import Memory
from service.policy.visible import Visible


@dataclass(frozen=True)
class MemoryFilters:
    subject: str | None = None
    kind: str | None = None
    key: str | None = None

    def conditions(self) -> list[Any]:
        pairs = ((Memory.subject, self.subject), (Memory.kind, self.kind), (Memory.key, self.key))
        return [column == value for column, value in pairs if value is not None]


async def lock_key(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    space_id: uuid.UUID,
    subject: str,
    kind: str,
    key: str,
) -> None:
    """Serialize writers of one (space, subject, kind, key) until commit, so concurrent writes
    supersede each other in order instead of colliding on the live-key unique index."""
    lock_name = f"{tenant_id}|{space_id}|{subject}|{kind}|{key}"
    await session.execute(select(func.pg_advisory_xact_lock(func.hashtextextended(lock_name, 0))))


async def supersede_live(
    session: AsyncSession,
    scope: Visible,
    *,
    space_id: uuid.UUID,
    subject: str,
    kind: str,
    key: str,
    new_id: uuid.UUID,
) -> list[tuple[uuid.UUID, int]]:
    """Close the live version(s) of this key in this space only: supersession is by key and
    scope, never by similarity, and never reaches into another space. Expired versions are
    closed too, so the key has exactly one unclosed row."""
    closed = await session.execute(
        scope.update(include_expired=True)
        .where(
            Memory.space_id == space_id,
            Memory.subject == subject,
            Memory.kind == kind,
            Memory.key == key,
        )
        .values(
            superseded_at=func.now(),
            valid_until=func.now(),
            superseded_by=new_id,
        )
        .returning(Memory.id, Memory.version)
    )
    return [(row.id, row.version) for row in closed.all()]


async def insert(session: AsyncSession, row: Memory) -> Memory:
    session.add(row)
    await session.flush()
    await session.refresh(row)
    return row


async def get(session: AsyncSession, scope: Visible, memory_id: uuid.UUID) -> Memory | None:
    found: Memory | None = await session.scalar(
        scope.select(Memory, include_superseded=True).where(Memory.id == memory_id)
    )
    return found


async def list_page(
    session: AsyncSession,
    scope: Visible,
    filters: MemoryFilters,
    *,
    after: uuid.UUID | None,
    limit: int,
) -> Sequence[Memory]:
    statement = scope.select(Memory).where(*filters.conditions())
    if after is not None:
        statement = statement.where(Memory.id < after)
    rows = await session.scalars(statement.order_by(Memory.id.desc()).limit(limit))
    return rows.all()


async def search(
    session: AsyncSession,
    scope: Visible,
    query_vector: list[float],
    filters: MemoryFilters,
    *,
    k: int,
    min_score: float | None,
) -> list[tuple[Memory, float]]:
    """Exact pre-filtered kNN in one statement: the inner query scores only visible rows (an
    index-only scan of the covering index when no filter needs the heap), the middle one ranks
    them, the outer one fetches the k winners. Complete by construction: if k visible rows
    exist, k come back.

    The scoring CTE is MATERIALIZED so `ORDER BY distance LIMIT k` can never be pushed into the
    scan: an ANN index (HNSW, IVFFlat) on `embedding` would otherwise rank the nearest rows of
    the whole table first and filter after, answering fewer than k (often zero) hits."""
    distance = Memory.embedding.cosine_distance(query_vector)
    scored = scope.select(Memory.id.label("id"), distance.label("distance")).where(
        *filters.conditions()
    )
    if min_score is not None:
        scored = scored.where(distance <= 1.0 - min_score)
    scored_cte = scored.cte("scored").prefix_with("MATERIALIZED")
    ranked_cte = (
        select(scored_cte.c.id, scored_cte.c.distance)
        .order_by(scored_cte.c.distance, scored_cte.c.id)
        .limit(k)
        .cte("ranked")
        .prefix_with("MATERIALIZED")
    )
    statement = (
        scope.select(Memory, (1.0 - ranked_cte.c.distance).label("score"))
        .join(ranked_cte, ranked_cte.c.id == Memory.id)
        .order_by(ranked_cte.c.distance, Memory.id)
    )
    rows = await session.execute(statement)
    return [(row[0], float(row[1])) for row in rows.all()]


async def delete(session: AsyncSession, scope: Visible, memory_id: uuid.UUID) -> bool:
    deleted = await session.scalar(
        scope.delete().where(Memory.id == memory_id).returning(Memory.id)
    )
    return deleted is not None


__all__ = [
    "MemoryFilters",
    "delete",
    "get",
    "insert",
    "list_page",
    "lock_key",
    "search",
    "supersede_live",
]
