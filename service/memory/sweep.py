"""`memory.sweep_expired`: hard-delete memories past `expires_at` plus the retention period.

Retention is the tenant's `retention_days` setting, else the operator's `MEMGATE_RETENTION_DAYS`.
Each batch reads at most `size` rows past the cutoff from `ix_memories_expiry` (ordered by
expiry, so it never lists the tenant), under `Visible(job principal, delete)`, and:

- deletes every such version that has a successor (`superseded_by` set): its row, vector and
  lexemes go;
- retracts the head of a chain instead (the newest version: nothing supersedes it) into the
  content-free stub a DELETE leaves (value, vector, hash, metadata and source cleared): its
  number stays taken, so the key's next write never re-issues it, and history shows a stub;
- leaves revoked rows alone: their content hash is the tombstone that stops the fact being
  learned again (promise 7).

Rows that name a swept id (`supersedes`, `superseded_by`, `derived_from`) keep the id; readers
treat it like any invisible one (a history walk stops there, a summary's input is withheld).
A dry run counts what it would do and changes nothing. The cursor is the (expires_at, id) of
the last row read, so a repeated batch reads the same rows (those it swept are gone).
"""

from __future__ import annotations

import base64
import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Select, and_, func, or_, tuple_
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.models import Memory
from service.jobs.declare import Batch, BatchDone, Job
from service.memory.operations import SWEEP_EXPIRED as SWEEP_OPERATION
from service.policy.visible import Action, Liveness, Visible, visible
from service.problems import InvalidRequest

_SWEEPABLE = Liveness.any_version().with_expired().with_retracted()
"""Every version, expired and retracted ones included; revoked ones never (tombstones stay)."""


def retention(batch: Batch) -> timedelta:
    days = batch.principal.tenant_settings.retention_days
    if days is None:
        days = batch.runtime.settings.jobs.retention_days
    return timedelta(days=days)


async def sweep_expired(batch: Batch) -> BatchDone:
    scope = visible(batch.principal, Action.DELETE)
    cutoff = datetime.now(UTC) - retention(batch)
    session = batch.call.db
    rows = await _past(
        session, scope, cutoff, batch.scope.space_id, _decode(batch.cursor), batch.size
    )
    older = [memory_id for memory_id, _, successor in rows if successor is not None]
    heads = [memory_id for memory_id, _, successor in rows if successor is None]
    if batch.scope.dry_run:
        deleted, retracted = len(older), len(heads)
    else:
        deleted = await _delete(session, scope, older)
        retracted = await _retract(session, scope, heads)
    batch.call.facts.add_targets(memory_id for memory_id, _, _ in rows)
    counts = {"scanned": len(rows), "deleted": deleted, "retracted": retracted}
    if len(rows) < batch.size:
        return BatchDone(counts, None)
    last_id, last_expiry, _ = rows[-1]
    return BatchDone(counts, _encode(last_expiry, last_id))


Row = tuple[uuid.UUID, datetime, uuid.UUID | None]
"""(id, expires_at, superseded_by) of a row past its time."""


async def _past(
    session: AsyncSession,
    scope: Visible,
    cutoff: datetime,
    space_id: uuid.UUID | None,
    after: tuple[datetime, uuid.UUID] | None,
    size: int,
) -> list[Row]:
    result = await session.execute(expired_rows(scope, cutoff, space_id, after, size))
    return [(row[0], row[1], row[2]) for row in result.all()]


def expired_rows(
    scope: Visible,
    cutoff: datetime,
    space_id: uuid.UUID | None,
    after: tuple[datetime, uuid.UUID] | None,
    size: int,
) -> Select[Any]:
    """Up to `size` rows past `cutoff`, in expiry order from `after`, read from the expiry
    index (tests/integration/jobs/test_sweep_plan.py holds it to that). A head that is already
    a stub has nothing left to sweep."""
    conditions = [
        Memory.expires_at.is_not(None),
        Memory.expires_at <= cutoff,
        or_(Memory.superseded_by.is_not(None), Memory.retracted_at.is_(None)),
    ]
    if space_id is not None:
        conditions.append(Memory.space_id == space_id)
    if after is not None:
        conditions.append(tuple_(Memory.expires_at, Memory.id) > tuple_(*after))
    return (
        scope.select(Memory.id, Memory.expires_at, Memory.superseded_by, liveness=_SWEEPABLE)
        .where(*conditions)
        .order_by(Memory.expires_at, Memory.id)
        .limit(size)
    )


async def _delete(session: AsyncSession, scope: Visible, ids: list[uuid.UUID]) -> int:
    if not ids:
        return 0
    gone = await session.scalars(
        scope.delete(liveness=_SWEEPABLE).where(Memory.id.in_(ids)).returning(Memory.id)
    )
    return len(gone.all())


async def _retract(session: AsyncSession, scope: Visible, ids: list[uuid.UUID]) -> int:
    """The heads into stubs, exactly as a DELETE of the API leaves them (the retract-only
    trigger accepts nothing else from a principal holding delete without write)."""
    if not ids:
        return 0
    now = func.now()
    stubbed = await session.scalars(
        scope.update(liveness=_SWEEPABLE)
        .where(and_(Memory.id.in_(ids), Memory.retracted_at.is_(None)))
        .values(
            {
                Memory.retracted_at: now,
                Memory.superseded_at: func.coalesce(Memory.superseded_at, now),
                Memory.value: "",
                Memory.value_sealed: None,
                Memory.value_key: None,
                Memory.content_hash: b"",
                Memory.embedding: None,
                Memory.metadata_: {},
                Memory.source: None,
            }
        )
        .returning(Memory.id)
    )
    return len(stubbed.all())


def _encode(expires_at: datetime, memory_id: uuid.UUID) -> str:
    raw = json.dumps({"v": 1, "at": expires_at.isoformat(), "id": str(memory_id)})
    return base64.urlsafe_b64encode(raw.encode()).decode()


def _decode(cursor: str | None) -> tuple[datetime, uuid.UUID] | None:
    if cursor is None:
        return None
    try:
        payload = json.loads(base64.urlsafe_b64decode(cursor.encode()))
        return datetime.fromisoformat(payload["at"]), uuid.UUID(payload["id"])
    except (ValueError, KeyError, TypeError) as exc:
        raise InvalidRequest("The sweep's cursor is not one it wrote.") from exc


SWEEP_EXPIRED = Job(SWEEP_OPERATION, sweep_expired, needs=frozenset({"read", "delete"}))
