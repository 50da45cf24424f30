"""THE predicate. Every statement that reads (or targets) memory rows starts here.

`Visible(principal, action)` = tenant from the token AND the row's space among the spaces the
principal holds `action` on AND every space in `read_requires` among them too, plus liveness.
It is SQL, applied before any ranking; nothing is filtered in Python afterwards. The allowed
spaces are a subquery *inside* the statement, so grants and data are read in one snapshot and
a search is one round trip. No grants means an empty array, which matches nothing: never "no
filter". A structural test fails if any other module selects, updates or deletes memory rows.

The grants are the `space_grants` view over the compiled closures (service/policy/compile.py):
every principal starts with read, write and delete in its personal space; rules add the rest.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Delete,
    ScalarSelect,
    Select,
    Update,
    and_,
    any_,
    cast,
    delete,
    func,
    literal,
    or_,
)
from sqlalchemy import select as sa_select
from sqlalchemy import update as sa_update
from sqlalchemy.dialects.postgresql import ARRAY, UUID
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased

from service.auth.principal import Principal
from service.db.models import Memory, Space, SpaceGrant
from service.observability.telemetry import span

_UUID_ARRAY = ARRAY(UUID)


class Action(StrEnum):
    READ = "read"
    WRITE = "write"
    DELETE = "delete"


@dataclass(frozen=True)
class Visible:
    tenant_id: uuid.UUID
    action: Action
    allowed: ColumnElement[Any]
    """A `uuid[]` SQL expression: the spaces the caller holds `action` on."""
    readable: ColumnElement[Any] | None = None
    """For writes and deletes: the spaces the caller reads. A row is touched only where the
    caller can also read it, `read_requires` included (None: `allowed` is the read set)."""

    @classmethod
    def of_spaces(
        cls, tenant_id: uuid.UUID, action: Action, space_ids: Sequence[uuid.UUID]
    ) -> Visible:
        """A fixed set of spaces (benchmarks, and jobs that snapshot their grants)."""
        return cls(tenant_id, action, cast(literal(list(space_ids), _UUID_ARRAY), _UUID_ARRAY))

    def clause(
        self, *, include_superseded: bool = False, include_expired: bool = False
    ) -> ColumnElement[bool]:
        readable = self.allowed if self.readable is None else self.readable
        conditions: list[ColumnElement[bool]] = [
            Memory.tenant_id == self.tenant_id,
            Memory.space_id == any_(self.allowed),
            Memory.read_requires.contained_by(readable),
            Memory.revoked_at.is_(None),
        ]
        if self.readable is not None:
            conditions.append(Memory.space_id == any_(readable))
        if not include_superseded:
            conditions.append(Memory.superseded_at.is_(None))
        if not include_expired:
            conditions.append(or_(Memory.expires_at.is_(None), Memory.expires_at > func.now()))
        return and_(*conditions)

    def select(
        self, *columns: Any, include_superseded: bool = False, include_expired: bool = False
    ) -> Select[Any]:
        return sa_select(*columns).where(
            self.clause(include_superseded=include_superseded, include_expired=include_expired)
        )

    def update(self, *, include_superseded: bool = False, include_expired: bool = False) -> Update:
        return sa_update(Memory).where(
            self.clause(include_superseded=include_superseded, include_expired=include_expired)
        )

    def delete(self) -> Delete:
        return delete(Memory).where(self.clause(include_superseded=True))


def live_rows_up_to(
    scope: Visible, limit: int, *conditions: ColumnElement[bool]
) -> ScalarSelect[int]:
    """How many live rows (neither superseded nor revoked) lie in the spaces `scope` allows and
    match `conditions`, counted no further than `limit`: an upper bound of the rows the caller
    sees, read from the narrow index `ix_memories_visible_count` without testing each row's
    `read_requires` or expiry (that per-row test is most of what counting the visible rows
    costs). For choosing a search path only; never a number anyone is shown or refused by."""
    capped = (
        sa_select(literal(1))
        .where(
            Memory.tenant_id == scope.tenant_id,
            Memory.space_id == any_(scope.allowed),
            Memory.superseded_at.is_(None),
            Memory.revoked_at.is_(None),
            *conditions,
        )
        .limit(limit)
        .subquery()
    )
    return sa_select(func.count()).select_from(capped).scalar_subquery()


def visible(principal: Principal, action: Action) -> Visible:
    with span("policy.visible", {"memgate.policy.action": action.value}):
        allowed = _granted_array(principal, action)
        readable = None if action is Action.READ else _granted_array(principal, Action.READ)
        return Visible(principal.tenant_id, action, allowed, readable)


def _granted_array(principal: Principal, action: Action) -> ColumnElement[Any]:
    granted = _granted_spaces(principal, action).subquery()
    array = (
        sa_select(func.coalesce(func.array_agg(granted.c.id), literal([], _UUID_ARRAY)))
        .select_from(granted)
        .scalar_subquery()
    )
    # The cast makes `= ANY(...)` take the array value, not the subquery's rows.
    return cast(array, _UUID_ARRAY)


async def granted_space_ids(
    session: AsyncSession, principal: Principal, action: Action
) -> list[uuid.UUID]:
    """The same grants as a list, for choosing where a write goes (not for reading rows)."""
    return list((await session.scalars(_granted_spaces(principal, action))).all())


def _granted_spaces(principal: Principal, action: Action) -> Select[uuid.UUID]:
    """The compiled grants (service/policy/compile.py), read in the statement's snapshot. A
    delegated call gets the spaces both the user and the acting agent hold `action` on."""
    granted = sa_select(SpaceGrant.space_id.label("id")).where(
        SpaceGrant.tenant_id == principal.tenant_id,
        SpaceGrant.principal_id == principal.principal_id,
        SpaceGrant.action == action.value,
    )
    if principal.actor_id is None:
        return granted
    actor = aliased(SpaceGrant)
    return granted.where(
        sa_select(actor.space_id)
        .where(
            actor.tenant_id == principal.tenant_id,
            actor.principal_id == principal.actor_id,
            actor.action == action.value,
            actor.space_id == SpaceGrant.space_id,
        )
        .exists()
    )


@dataclass(frozen=True)
class WriteTargets:
    """Where a caller may put a memory: the spaces it reads, those it writes (a writer must
    read too, so `writable` holds only readable spaces) and its personal space, if any."""

    readable: frozenset[uuid.UUID]
    writable: tuple[uuid.UUID, ...]
    personal: uuid.UUID | None


async def write_targets(session: AsyncSession, principal: Principal) -> WriteTargets:
    """`granted_space_ids` for read and for write and `personal_space_id`, in one statement
    (one snapshot, one round trip): the question "where may this caller write?" asked once."""
    row = (
        await session.execute(
            sa_select(
                _granted_array(principal, Action.READ),
                _granted_array(principal, Action.WRITE),
                _personal_space(principal).scalar_subquery(),
            )
        )
    ).one()
    reads = frozenset(row[0])
    return WriteTargets(reads, tuple(s for s in row[1] if s in reads), row[2])


def _personal_space(principal: Principal) -> Select[uuid.UUID]:
    return sa_select(Space.id).where(
        Space.tenant_id == principal.tenant_id,
        Space.owner_id == principal.principal_id,
        Space.kind == "personal",
    )


async def personal_space_id(session: AsyncSession, principal: Principal) -> uuid.UUID | None:
    """The caller's own space (where writes go unless they name another)."""
    found: uuid.UUID | None = await session.scalar(_personal_space(principal))
    return found
