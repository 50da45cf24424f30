"""THE predicate. Every statement that reads (or targets) memory rows starts here.

`Visible(principal, action)` = tenant from the token AND the row's space among the spaces the
principal holds `action` on AND every space in `read_requires` among them too, plus liveness.
It is SQL, applied before any ranking; nothing is filtered in Python afterwards. No grants means
`FALSE`, never "no filter". A structural test fails if any other module selects, updates or
deletes memory rows.

Today's grants: each principal reads, writes and deletes in its own personal space. The policy
issue replaces `_granted_spaces` with the compiled `space_grants` table; callers do not change.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sqlalchemy import ColumnElement, Delete, Select, Update, and_, any_, delete, false, func, or_
from sqlalchemy import select as sa_select
from sqlalchemy import update as sa_update
from sqlalchemy.dialects.postgresql import ARRAY, UUID, array
from sqlalchemy.ext.asyncio import AsyncSession

from service.auth.principal import Principal
from service.db.models import Memory, Space


class Action(StrEnum):
    READ = "read"
    WRITE = "write"
    DELETE = "delete"


@dataclass(frozen=True)
class Visible:
    tenant_id: uuid.UUID
    action: Action
    space_ids: tuple[uuid.UUID, ...]

    def allows_space(self, space_id: uuid.UUID) -> bool:
        return space_id in self.space_ids

    def clause(
        self, *, include_superseded: bool = False, include_expired: bool = False
    ) -> ColumnElement[bool]:
        if not self.space_ids:
            return false()
        allowed = array(self.space_ids, type_=UUID)
        conditions: list[ColumnElement[bool]] = [
            Memory.tenant_id == self.tenant_id,
            Memory.space_id == any_(allowed),
            Memory.read_requires.contained_by(allowed.cast(ARRAY(UUID))),
            Memory.revoked_at.is_(None),
        ]
        if not include_superseded:
            conditions.append(Memory.superseded_at.is_(None))
        if not include_expired:
            conditions.append(or_(Memory.expires_at.is_(None), Memory.expires_at > func.now()))
        return and_(*conditions)

    def select(self, *columns: Any, include_superseded: bool = False) -> Select[Any]:
        return sa_select(*columns).where(self.clause(include_superseded=include_superseded))

    def update(self, *, include_expired: bool = False) -> Update:
        return sa_update(Memory).where(self.clause(include_expired=include_expired))

    def delete(self) -> Delete:
        return delete(Memory).where(self.clause(include_superseded=True))


async def visible(session: AsyncSession, principal: Principal, action: Action) -> Visible:
    return Visible(
        tenant_id=principal.tenant_id,
        action=action,
        space_ids=await _granted_spaces(session, principal, action),
    )


async def _granted_spaces(
    session: AsyncSession, principal: Principal, action: Action
) -> tuple[uuid.UUID, ...]:
    rows = await session.scalars(
        sa_select(Space.id).where(
            Space.tenant_id == principal.tenant_id,
            Space.owner_id == principal.principal_id,
            Space.kind == "personal",
        )
    )
    return tuple(rows.all())
