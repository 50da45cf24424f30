"""`memory.age_unused`: memories nobody wrote or recalled for their space's `max_unused_days`
expire (docs/jobs.md, "memory.age_unused").

Each batch examines the next `size` live memories of the spaces that set `max_unused_days`
(by id, from the run's cursor) as the job principal, and sets `expires_at` to now on those
whose last write or recall (service/memory/recalls.py) is older than that many whole days:
in place, so no version is added and history is unchanged; expired rows drop out of every
read at once and `memory.sweep_expired` removes them after the retention period. A dry run
counts what it would expire and changes nothing. A repeated batch finds only rows still live,
so it is safe to run again from the same cursor.
"""

from __future__ import annotations

import uuid

from service.jobs.declare import Batch, BatchDone
from service.memory import repository
from service.policy.visible import Action, visible
from service.problems import BadCursor


def parse_cursor(cursor: str | None) -> uuid.UUID | None:
    """A job cursor is the id of the last row a batch examined."""
    if cursor is None:
        return None
    try:
        return uuid.UUID(cursor)
    except ValueError:
        raise BadCursor(
            "The run's cursor is not one this job wrote (the id of the last memory a batch "
            "examined). Start the run again without a cursor. Nothing was changed."
        ) from None


async def age_unused_batch(batch: Batch) -> BatchDone:
    # Write (which includes read): the job may only expire rows it could write itself.
    scope = visible(batch.principal, Action.WRITE)
    aged = await repository.age_unused(
        batch.call.db,
        scope,
        after=parse_cursor(batch.cursor),
        size=batch.size,
        space_id=batch.scope.space_id,
        expire=not batch.scope.dry_run,
    )
    batch.call.facts.add_targets([*aged.unused, *aged.summaries])
    batch.call.facts.count(len(aged.unused))
    done = aged.examined < batch.size or aged.last is None
    outcome = "would_expire" if batch.scope.dry_run else "expired"
    counts = {"examined": aged.examined, outcome: len(aged.unused)}
    if aged.summaries:
        # Summaries derived from an expired row expire with it (docs/jobs.md).
        counts["summaries_expired"] = len(aged.summaries)
    return BatchDone(counts=counts, cursor=None if done else str(aged.last))
