"""The write side of the review state (docs/concepts.md, "Review"): what makes a write a
proposal, and the rejections that refuse a re-proposal.

A write into a space whose settings say `review: true`, by a writer who is none of the space's
reviewers (`WriteTargets.proposes`), is stored with `review_state = 'proposed'` and version 0:
it supersedes nothing, holds no live-key slot, and only its writer and the reviewers see it
(service/policy/visible.py, the review clause). A rejected proposal leaves the hash of its
normalized text in `review_rejections`; the same text proposed again into that space is
refused (409 `proposal-rejected`). Approve and reject: service/memory/review.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Protocol

from sqlalchemy import select, tuple_
from sqlalchemy.ext.asyncio import AsyncSession

from service.auth.principal import Principal
from service.db.models import Memory, ReviewRejection
from service.memory.normalize import content_hash
from service.memory.problems import ProposalRejected
from service.problems import Problem

PROPOSED = "proposed"
REJECTED = "rejected"


def text_hash(value: str) -> bytes:
    """The hash a rejection is kept and compared by: the same normalization as revocation's
    (service/memory/normalize.py: NFKC, case fold, default-ignorable code points removed,
    white space collapsed), so an invisible character never re-proposes a rejected claim."""
    return content_hash(value)


def proposal(row: Memory) -> Memory:
    """`row` as a proposal: numbered (and linked to its key's chain) only when approved."""
    row.review_state = PROPOSED
    row.version = 0
    row.supersedes = None
    return row


class Proposing(Protocol):
    """What `rejected_again` reads of a planned write (service/memory/service.py `Planned`)."""

    @property
    def proposed(self) -> bool: ...
    @property
    def space_id(self) -> uuid.UUID: ...
    @property
    def value(self) -> str: ...


async def rejected_again(
    session: AsyncSession, principal: Principal, planned: Sequence[Proposing]
) -> list[tuple[int, Problem]]:
    """(place, problem) of each proposal whose normalized text a reviewer of its space
    rejected before, in one statement (no memory row is read: the hashes have their table)."""
    asked = {
        index: (one.space_id, text_hash(one.value))
        for index, one in enumerate(planned)
        if one.proposed
    }
    if not asked:
        return []
    found = set(
        (
            await session.execute(
                select(ReviewRejection.space_id, ReviewRejection.text_hash).where(
                    ReviewRejection.tenant_id == principal.tenant_id,
                    tuple_(ReviewRejection.space_id, ReviewRejection.text_hash).in_(
                        list(set(asked.values()))
                    ),
                )
            )
        ).all()
    )
    return [
        (index, _rejected(space_id))
        for index, (space_id, digest) in asked.items()
        if (space_id, digest) in found
    ]


def _rejected(space_id: uuid.UUID) -> ProposalRejected:
    return ProposalRejected(
        f"A reviewer of space {space_id} rejected this text, so it cannot be proposed there "
        "again (the comparison ignores case and white space). Nothing was written; only a "
        "reviewer of the space may write it.",
        space_id=str(space_id),
    )
