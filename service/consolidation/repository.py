"""SQL of consolidation. Every read of memories starts from `Visible` (the job principal's)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, and_, any_, cast, func, literal, not_, select, tuple_
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.models import Memory, Space
from service.policy.space_settings import SpaceSettings
from service.policy.space_settings import stored as stored_settings
from service.policy.visible import Visible

_UUIDS = ARRAY(UUID)
SUMMARY_KIND = "summary"
SCOPE_KEY = "consolidation"
"""The key of a per-scope summary: one live version per (space, subject, audience)."""
ACROSS_KEY = "consolidation.across"
"""The key of a cross-space summary (in the space whose policy asked for it)."""
OUTPUT_SOURCE = "memgate:consolidation"
"""The `source` of every summary this job writes."""


def _uuids(values: Sequence[uuid.UUID]) -> ColumnElement[Any]:
    return cast(literal(list(values), _UUIDS), _UUIDS)


def _is_output(key: str | None = None) -> ColumnElement[bool]:
    keys = (SCOPE_KEY, ACROSS_KEY) if key is None else (key,)
    return and_(Memory.kind == SUMMARY_KIND, Memory.key.in_(keys))


@dataclass(frozen=True)
class Group:
    """A per-scope group: the live memories of one subject in one space with one audience."""

    space_id: uuid.UUID
    subject: str
    read_requires: tuple[uuid.UUID, ...]


async def scope_groups(
    session: AsyncSession,
    scope: Visible,
    spaces: Sequence[uuid.UUID],
    *,
    subject: str | None,
    after: Group | None,
    limit: int,
) -> list[Group]:
    """The next `limit` groups after `after`, in (space, subject, audience) order: every group
    with a live memory the job can read in `spaces`, its own per-scope summary included (so a
    summary whose inputs are all gone is found and retracted)."""
    columns = (Memory.space_id, Memory.subject, Memory.read_requires)
    statement = scope.select(*columns).where(
        Memory.space_id == any_(_uuids(spaces)), not_(_is_output(ACROSS_KEY))
    )
    if subject is not None:
        statement = statement.where(Memory.subject == subject)
    if after is not None:
        statement = statement.where(
            tuple_(*columns)
            > tuple_(
                literal(after.space_id, UUID), literal(after.subject), _uuids(after.read_requires)
            )
        )
    rows = await session.execute(statement.group_by(*columns).order_by(*columns).limit(limit))
    return [Group(space, subj, tuple(required)) for space, subj, required in rows.all()]


async def across_subjects(
    session: AsyncSession,
    scope: Visible,
    home: uuid.UUID,
    spaces: Sequence[uuid.UUID],
    *,
    subject: str | None,
    after: str | None,
    limit: int,
) -> list[str]:
    """The subjects of `home`'s cross-space summaries, in order after `after`: those with live
    memories the job can read in at least two of `spaces` (home and the spaces its policy
    names), and those that have a cross-space summary in `home` already (to re-derive or
    retract it)."""
    conditions: list[ColumnElement[bool]] = []
    if subject is not None:
        conditions.append(Memory.subject == subject)
    if after is not None:
        conditions.append(Memory.subject > after)
    spread = (
        scope.select(Memory.subject)
        .where(Memory.space_id == any_(_uuids(spaces)), not_(_is_output()), *conditions)
        .group_by(Memory.subject)
        .having(func.count(func.distinct(Memory.space_id)) >= 2)
    )
    summarized = scope.select(Memory.subject).where(
        Memory.space_id == home, _is_output(ACROSS_KEY), *conditions
    )
    both = spread.union(summarized).subquery("subjects")
    rows = await session.scalars(select(both.c.subject).order_by(both.c.subject).limit(limit))
    return list(rows.all())


@dataclass(frozen=True)
class InputRow:
    id: uuid.UUID
    space_id: uuid.UUID
    read_requires: tuple[uuid.UUID, ...]
    key: str
    kind: str
    value: str
    version: int
    content_hash: bytes
    source: str | None
    recorded_at: datetime
    expires_at: datetime | None


async def inputs_of(
    session: AsyncSession,
    scope: Visible,
    spaces: Sequence[uuid.UUID],
    subject: str,
    *,
    read_requires: tuple[uuid.UUID, ...] | None,
    limit: int,
) -> list[InputRow]:
    """The live memories of `subject` in `spaces` the job can read (with exactly the audience
    `read_requires` for a per-scope group; any for a cross-space one), newest first, at most
    `limit`. Summaries this job wrote are never inputs."""
    statement = scope.select(
        Memory.id,
        Memory.space_id,
        Memory.read_requires,
        Memory.key,
        Memory.kind,
        Memory.value,
        Memory.version,
        Memory.content_hash,
        Memory.source,
        Memory.recorded_at,
        Memory.expires_at,
    ).where(
        Memory.space_id == any_(_uuids(spaces)),
        Memory.subject == subject,
        not_(_is_output()),
    )
    if read_requires is not None:
        statement = statement.where(Memory.read_requires == _uuids(read_requires))
    rows = await session.execute(
        statement.order_by(Memory.recorded_at.desc(), Memory.id.desc()).limit(limit)
    )
    return [
        InputRow(
            row.id,
            row.space_id,
            tuple(row.read_requires),
            row.key,
            row.kind,
            row.value,
            row.version,
            bytes(row.content_hash),
            row.source,
            row.recorded_at,
            row.expires_at,
        )
        for row in rows.all()
    ]


@dataclass(frozen=True)
class Previous:
    """A live summary this job wrote for an item."""

    id: uuid.UUID
    read_requires: tuple[uuid.UUID, ...]
    fingerprint: str | None


async def previous_summaries(
    session: AsyncSession,
    scope: Visible,
    space_id: uuid.UUID,
    subject: str,
    key: str,
    *,
    read_requires: tuple[uuid.UUID, ...] | None,
) -> list[Previous]:
    """The live summaries under `key` of `subject` in `space_id` the job can read (for a
    per-scope group, only the one with its audience)."""
    statement = scope.select(Memory.id, Memory.read_requires, Memory.metadata_).where(
        Memory.space_id == space_id,
        Memory.subject == subject,
        _is_output(key),
    )
    if read_requires is not None:
        statement = statement.where(Memory.read_requires == _uuids(read_requires))
    rows = await session.execute(statement.order_by(Memory.id))
    return [
        Previous(row.id, tuple(row.read_requires), _fingerprint_of(row.metadata_))
        for row in rows.all()
    ]


def _fingerprint_of(metadata: Any) -> str | None:
    found = metadata.get("consolidation") if isinstance(metadata, dict) else None
    value = found.get("fingerprint") if isinstance(found, dict) else None
    return value if isinstance(value, str) else None


async def space_settings(
    session: AsyncSession, tenant_id: uuid.UUID, spaces: Sequence[uuid.UUID]
) -> dict[uuid.UUID, SpaceSettings]:
    """The settings of the given spaces that have any (the rest take the defaults): each
    space's consolidation policy, its source policy included, applies to its own rows."""
    rows = await session.execute(
        select(Space.id, Space.settings).where(
            Space.tenant_id == tenant_id,
            Space.id == any_(_uuids(spaces)),
            Space.settings != literal({}, JSONB),
        )
    )
    return {space_id: stored_settings(raw) for space_id, raw in rows.all()}
