"""Deciding proposals (docs/concepts.md, "Review"): list a space's proposals, approve one (it
becomes the live version of its key, superseding as any write does) or reject one (a tombstone
no read returns; its normalized text cannot be proposed into the space again).

A reviewer of a space holds `review` and `write` there (write: approving puts a version into
the space, and row-level security lets only writers change its rows), with a token carrying
`review:memory`, and is no agent (`service.policy.visible.may_review`). A space the caller
cannot read is 404, as everywhere; one it reads but does not review is 403 `not-a-reviewer`.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any

import msgspec
from sqlalchemy import Select, Update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession

from service.auth.principal import Principal
from service.calls import Facts
from service.db.models import Memory, ReviewRejection
from service.db.types import NOT_BLANK
from service.memory import repository
from service.memory.etags import IfMatch, check_memory
from service.memory.problems import MemoryNotFound, NotAProposal, NotAReviewer, SpaceNotFound
from service.memory.proposals import PROPOSED, REJECTED, text_hash
from service.memory.repository import ANSWER, KeyRef, NewVersion, Version, cast_row
from service.memory.schemas import MemoryPage, MemoryWritten
from service.memory.service import decode_cursor, encode_cursor, not_found_detail, to_out
from service.policy.visible import (
    LIVE,
    Action,
    Liveness,
    Visible,
    WriteTargets,
    visible,
    write_targets,
)
from service.problems import InvalidRequest
from service.revocation import repository as revocations
from service.shredding import opened_value, vault_of

MAX_PROPOSALS_PAGE = 100
DEFAULT_PROPOSALS_PAGE = 50


RejectReason = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=500,
        pattern=NOT_BLANK,
        description="Why the proposal is rejected: kept on the rejected memory (never in the "
        "audit log).",
    ),
]


class Rejection(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    reason: RejectReason


class Rejected(msgspec.Struct, kw_only=True):
    id: uuid.UUID
    space_id: uuid.UUID
    status: str = REJECTED
    reason: str
    reviewed_at: datetime


class ReviewService:
    def __init__(self, session: AsyncSession, *, facts: Facts) -> None:
        self._session = session
        self._facts = facts

    async def list_proposals(
        self, principal: Principal, space_id: uuid.UUID, cursor: str | None, limit: int | None
    ) -> MemoryPage:
        """The space's live proposals, newest first, `limit` (1-100, default 50) per page."""
        size = DEFAULT_PROPOSALS_PAGE if limit is None else limit
        if not 1 <= size <= MAX_PROPOSALS_PAGE:
            raise InvalidRequest(
                f"'limit' must be 1 to {MAX_PROPOSALS_PAGE}.",
                errors=[{"field": "limit", "message": "out of range"}],
            )
        after = decode_cursor(cursor) if cursor else None
        targets = await write_targets(self._session, principal)
        if space_id not in targets.readable:
            raise SpaceNotFound(f"Space {space_id} does not exist or is not visible to you.")
        _require_reviewer(targets, space_id)
        statement = _proposals(visible(principal, Action.READ), space_id, after, size + 1)
        rows = (await self._session.execute(statement)).all()
        plain = await vault_of(self._session).plaintexts(rows[:size])
        items = [to_out(cast_row(row), plain) for row in rows[:size]]
        self._facts.add_targets([space_id])
        self._facts.count(len(items))
        next_cursor = encode_cursor(rows[size - 1].id) if len(rows) > size else None
        return MemoryPage(items=items, next_cursor=next_cursor)

    async def approve(
        self, principal: Principal, memory_id: uuid.UUID, if_match: IfMatch | None = None
    ) -> MemoryWritten:
        """The proposal becomes the live version of its key: the live one (if any) is closed
        and the proposal numbered after the key's newest version, recorded now. `if_match`:
        only while the key's live version is the one named (the one the proposal supersedes),
        checked under the key lock: a version written since the reviewer read the key is 412."""
        ref = KeyRef.of(await self._proposal(principal, memory_id))
        now = await _lock_decision(self._session, principal, ref)
        row = await self._still_proposed(principal, memory_id)
        writer = visible(principal, Action.WRITE)
        if if_match is not None:
            live = await repository.live_versions(self._session, writer, [ref])
            if_match.check(live.get(ref))
        [made] = await repository.supersede_many(
            self._session, writer, [NewVersion(ref, row.id, row.valid_from)], at=now
        )
        previous = made.previous
        decided = {"reviewed_by": principal.principal_id, "reviewed_at": now, "recorded_at": now}
        approved = (
            await self._session.execute(
                _decide(writer, memory_id, decided, review_state=None)
                .values(
                    version=previous.version + 1 if previous else 1,
                    supersedes=previous.id if previous else None,
                )
                .returning(*ANSWER)
            )
        ).one()
        self._facts.add_targets([memory_id, *made.superseded])
        plain = await vault_of(self._session).plaintexts([approved])
        return MemoryWritten(memory=to_out(cast_row(approved), plain), superseded=made.superseded)

    async def reject(
        self,
        principal: Principal,
        memory_id: uuid.UUID,
        rejection: Rejection,
        if_match: IfMatch | None = None,
    ) -> Rejected:
        """The proposal becomes a tombstone (closed, out of every read), and the hash of its
        normalized text refuses the same proposal into the space again. `if_match`: only while
        it names the proposal itself (`"<id>.0"`), checked under the key lock."""
        ref = KeyRef.of(await self._proposal(principal, memory_id))
        now = await _lock_decision(self._session, principal, ref)
        row = await self._still_proposed(principal, memory_id)
        check_memory(if_match, Version(row.id, row.version))
        decided = {"reviewed_by": principal.principal_id, "reviewed_at": now}
        await self._session.execute(
            # Closed too: a tombstone leaves the live indexes (no search walks past it).
            _decide(
                visible(principal, Action.WRITE), memory_id, decided, review_state=REJECTED
            ).values(review_reason=rejection.reason, superseded_at=now)
        )
        await self._session.execute(
            pg_insert(ReviewRejection)
            .values(
                tenant_id=principal.tenant_id,
                space_id=row.space_id,
                text_hash=text_hash(await opened_value(self._session, row)),
                memory_id=memory_id,
            )
            .on_conflict_do_nothing()
        )
        self._facts.add_targets([memory_id])
        return Rejected(
            id=memory_id, space_id=row.space_id, reason=rejection.reason, reviewed_at=now
        )

    async def _proposal(self, principal: Principal, memory_id: uuid.UUID) -> Memory:
        """The live memory `memory_id` as the caller sees it, if it is a proposal the caller
        may decide on: 404 if unseen, 403 for a non-reviewer (its writer), 409 if no proposal."""
        found = await _one(self._session, visible(principal, Action.READ), memory_id)
        if found is None:
            raise MemoryNotFound(not_found_detail(memory_id))
        targets = await write_targets(self._session, principal)
        _require_reviewer(targets, found.space_id)
        return _pending(found)

    async def _still_proposed(self, principal: Principal, memory_id: uuid.UUID) -> Memory:
        """`_proposal` read again under the decision's locks (the caller's reviewer grants
        were checked before them): a concurrent decision or revoke may have come first, 404
        or 409 then."""
        found = await _one(self._session, visible(principal, Action.READ), memory_id)
        if found is None:
            raise MemoryNotFound(not_found_detail(memory_id))
        return _pending(found)


def _pending(found: Memory) -> Memory:
    """`found`, if it waits for review (409 otherwise)."""
    if found.review_state != PROPOSED:
        raise NotAProposal(
            f"Memory {found.id} is not waiting for review (it is an ordinary memory, or "
            "was decided already). Nothing changed."
        )
    return found


async def _lock_decision(session: AsyncSession, principal: Principal, ref: KeyRef) -> datetime:
    """The key's lock, after the tenant's revocation lock in shared mode (as every write takes
    it): a revoke in flight that hides the proposal commits first and the re-read under the
    locks finds it gone (404), instead of the decision's update finding no row (was a 500)."""
    return await repository.lock_keys(
        session, [ref], shared=[revocations.lock_name(principal.tenant_id)]
    )


def _proposals(
    scope: Visible, space_id: uuid.UUID, after: uuid.UUID | None, limit: int
) -> Select[Any]:
    """The proposals of `space_id` the caller sees, newest first, after the cursor's id."""
    statement = (
        scope.select(*ANSWER)
        .where(Memory.space_id == space_id, Memory.review_state == PROPOSED)
        .order_by(Memory.id.desc())
        .limit(limit)
    )
    return statement if after is None else statement.where(Memory.id < after)


async def _one(session: AsyncSession, scope: Visible, memory_id: uuid.UUID) -> Memory | None:
    """Any version of `memory_id` the caller sees (a decided proposal too: 409, not 404)."""
    found: Memory | None = await session.scalar(
        scope.select(Memory, liveness=Liveness.any_version()).where(Memory.id == memory_id)
    )
    return found


def _decide(
    scope: Visible, memory_id: uuid.UUID, decided: dict[str, Any], *, review_state: str | None
) -> Update:
    """The update that decides the live proposal `memory_id` (nothing else: a decided one is
    not proposed any more)."""
    return (
        scope.update(liveness=LIVE)
        .where(Memory.id == memory_id, Memory.review_state == PROPOSED)
        .values(review_state=review_state, **decided)
    )


def _require_reviewer(targets: WriteTargets, space_id: uuid.UUID) -> None:
    if space_id not in targets.reviewable or space_id not in targets.writable:
        raise NotAReviewer(
            f"You are not a reviewer of space {space_id}: reviewing needs the 'review' and "
            "'write' grants there and a token with the 'review:memory' scope (agents and "
            "delegated tokens never review). Nothing changed."
        )
