"""SQL of consolidation. Every read of memories starts from `Visible` (the job principal's)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    and_,
    any_,
    cast,
    exists,
    func,
    literal,
    not_,
    select,
    true,
    tuple_,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased

from service.db.models import Memory, Space
from service.memory.repository import SEALING
from service.memory.reserved import ACROSS_KEY, SCOPE_KEY, SUMMARY_KIND
from service.policy.space_settings import SpaceSettings
from service.policy.space_settings import stored as stored_settings
from service.policy.visible import Liveness, Visible
from service.shredding import vault_of

_UUIDS = ARRAY(UUID)


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
        *SEALING,
    ).where(
        Memory.space_id == any_(_uuids(spaces)),
        Memory.subject == subject,
        not_(_is_output()),
    )
    if read_requires is not None:
        statement = statement.where(Memory.read_requires == _uuids(read_requires))
    found = (
        await session.execute(
            statement.order_by(Memory.recorded_at.desc(), Memory.id.desc()).limit(limit)
        )
    ).all()
    # A summary of a crypto-shredding tenant is made from the opened text (and sealed again
    # when written, under the summary's owner's key).
    plain = await vault_of(session).plaintexts(found)
    return [
        InputRow(
            row.id,
            row.space_id,
            tuple(row.read_requires),
            row.key,
            row.kind,
            plain.get(row.id, row.value),
            row.version,
            bytes(row.content_hash),
            row.source,
            row.recorded_at,
            row.expires_at,
        )
        for row in found
    ]


@dataclass(frozen=True)
class Previous:
    """A live summary under an item's key. Its fingerprint is None unless the job principal
    wrote it: a row someone else put there (before the write path refused that) is never
    counted as the job's own, so the next run supersedes it."""

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
    writer_id: uuid.UUID,
    hidden: bool = False,
) -> list[Previous]:
    """The live summaries under `key` of `subject` in `space_id` the job can read (for a
    per-scope group, only the one with its audience); only those `writer_id` (the job
    principal) wrote carry their fingerprint. `hidden`: instead the current ones a revocation
    hides (a summary stored hidden is not written again by every run while it stands)."""
    liveness = replace(Liveness.live(), revoked=True) if hidden else Liveness.live()
    statement = scope.select(
        Memory.id, Memory.read_requires, Memory.metadata_, Memory.writer_id, liveness=liveness
    ).where(
        Memory.space_id == space_id,
        Memory.subject == subject,
        _is_output(key),
        Memory.revoked_at.is_not(None) if hidden else true(),
    )
    if read_requires is not None:
        statement = statement.where(Memory.read_requires == _uuids(read_requires))
    rows = await session.execute(statement.order_by(Memory.id))
    return [
        Previous(
            row.id,
            tuple(row.read_requires),
            _fingerprint_of(row.metadata_) if row.writer_id == writer_id else None,
        )
        for row in rows.all()
    ]


@dataclass(frozen=True)
class Tainted:
    """A version of a job summary built from a retracted input: its key, to lock it."""

    id: uuid.UUID
    space_id: uuid.UUID
    subject: str
    key: str
    read_requires: tuple[uuid.UUID, ...]


_EVERY_VERSION = Liveness.any_version().with_expired()
"""Live, superseded and expired versions: each one holds text a read (history, time travel,
revert) could still reach."""
_RETRACTED = Liveness.any_version().with_retracted().with_expired()


async def tainted_summaries(
    session: AsyncSession,
    scope: Visible,
    homes: Sequence[uuid.UUID],
    *,
    after: uuid.UUID | None,
    limit: int,
) -> list[Tainted]:
    """Up to `limit` unretracted versions (any, superseded and expired included) of the job's
    summaries in `homes` whose `derived_from` names a version that has been retracted (its
    stub), both read under `scope`, in id order after `after`: they still carry the retracted
    text."""
    gone = aliased(Memory, name="gone")
    retracted_input = scope.select(literal(1), liveness=_RETRACTED, on=gone).where(
        gone.retracted_at.is_not(None), gone.id == any_(Memory.derived_from)
    )
    statement = (
        scope.select(
            Memory.id,
            Memory.space_id,
            Memory.subject,
            Memory.key,
            Memory.read_requires,
            liveness=_EVERY_VERSION,
        )
        .where(
            Memory.space_id == any_(_uuids(homes)),
            _is_output(),
            exists(retracted_input),
            *(() if after is None else (Memory.id > after,)),
        )
        .order_by(Memory.id)
        .limit(limit)
    )
    rows = await session.execute(statement)
    return [
        Tainted(row.id, row.space_id, row.subject, row.key, tuple(row.read_requires))
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
