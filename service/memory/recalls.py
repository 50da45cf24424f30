"""Last recall, noted cheaply: what `memory.age_unused` needs to tell a used memory from one
nobody asked for in months (docs/jobs.md, "memory.age_unused").

A search or get hands the ids it answered to `RecallLog.note`, which only puts them in a dict
in this process: the read sends no statement more and writes nothing. A background task
writes what waits every `flush_seconds` (or as soon as `flush_ids` wait), one upsert per
tenant in a transaction that names that tenant for row-level security, at a day's resolution:
an id already noted today costs nothing in the database (the upsert's `WHERE` leaves the row
alone). The buffer is bounded (`max_pending`); past it recalls are dropped and counted, never
queued without end. `close()` writes what waits; a crash loses at most the last
`flush_seconds` of recalls, which at worst lets a memory age a few seconds early.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterable
from contextlib import suppress
from datetime import UTC, date, datetime

import structlog
from sqlalchemy import Date, cast, func, literal, select
from sqlalchemy.dialects.postgresql import ARRAY, UUID, Insert, insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.db.models import MemoryRecall
from service.db.tenancy import name_tenant
from service.settings import RecallSettings

_log = structlog.get_logger("memgate.recalls")

Recall = tuple[uuid.UUID, uuid.UUID]
"""(tenant, memory id)."""


def today() -> date:
    return datetime.now(UTC).date()


class RecallLog:
    """The recalls of this process not yet written, and the task that writes them."""

    def __init__(
        self, sessionmaker: async_sessionmaker[AsyncSession], settings: RecallSettings
    ) -> None:
        self._sessionmaker = sessionmaker
        self._settings = settings
        self._pending: dict[Recall, date] = {}
        self._due = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.dropped = 0
        """Recalls not kept because the buffer was full (logged at each flush)."""

    @property
    def pending(self) -> int:
        return len(self._pending)

    def note(self, tenant_id: uuid.UUID, memory_ids: Iterable[uuid.UUID]) -> None:
        """The ids a read answered: held until the next flush (no statement, no await)."""
        on = today()
        for memory_id in memory_ids:
            recall = (tenant_id, memory_id)
            if recall not in self._pending and len(self._pending) >= self._settings.max_pending:
                self.dropped += 1
                continue
            self._pending[recall] = on
        if len(self._pending) >= self._settings.flush_ids:
            self._due.set()
        self._start()

    def _start(self) -> None:
        """The writer runs in the loop of the first read that noted something (the app's)."""
        if self._task is None and not self._closed:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            with suppress(TimeoutError):
                await asyncio.wait_for(self._due.wait(), self._settings.flush_seconds)
            self._due.clear()
            try:
                await self.flush()
            except Exception as exc:  # the database is away: the recalls wait for the next try
                _log.warning("recall_flush_failed", error_type=type(exc).__name__)
                # Not at once again, however many reads note ids meanwhile.
                await asyncio.sleep(self._settings.flush_seconds)

    async def flush(self) -> int:
        """Write what waits, one transaction per tenant; returns how many recalls were written.
        A tenant whose write fails keeps its recalls for the next flush (room permitting)."""
        taken, self._pending = self._pending, {}
        if self.dropped:
            _log.warning(
                "recalls_dropped", dropped=self.dropped, max_pending=self._settings.max_pending
            )
            self.dropped = 0
        by_tenant: dict[uuid.UUID, dict[uuid.UUID, date]] = {}
        for (tenant_id, memory_id), on in taken.items():
            by_tenant.setdefault(tenant_id, {})[memory_id] = on
        written, failed = 0, None
        for tenant_id, recalls in by_tenant.items():
            try:
                await self._write(tenant_id, recalls)
            except IntegrityError:
                # The tenant is gone (its row deleted): keeping these would fail for ever.
                _log.warning("recalls_of_unknown_tenant_dropped", dropped=len(recalls))
                continue
            except Exception as exc:  # kept for the next flush; the other tenants go on
                self._keep(tenant_id, recalls)
                failed = failed or exc
                continue
            written += len(recalls)
        if failed is not None:
            raise failed
        return written

    def _keep(self, tenant_id: uuid.UUID, recalls: dict[uuid.UUID, date]) -> None:
        for memory_id, on in recalls.items():
            recall = (tenant_id, memory_id)
            if recall in self._pending or len(self._pending) < self._settings.max_pending:
                self._pending[recall] = max(on, self._pending.get(recall, on))

    async def _write(self, tenant_id: uuid.UUID, recalls: dict[uuid.UUID, date]) -> None:
        """One upsert of the tenant's recalls: a later day replaces an earlier one; the same
        day leaves the row untouched (no new tuple)."""
        by_day: dict[date, list[uuid.UUID]] = {}
        for memory_id, on in recalls.items():
            by_day.setdefault(on, []).append(memory_id)
        async with self._sessionmaker.begin() as session:
            await name_tenant(session, tenant_id)
            for on, ids in by_day.items():  # one day, except across midnight
                # In id order: replicas upserting the same ids lock them in the same order,
                # so two flushes never deadlock.
                await session.execute(_upsert(tenant_id, sorted(ids), on))

    async def close(self) -> None:
        """Stop the writer and write what waits (a clean stop loses nothing)."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        try:
            await self.flush()
        except Exception as exc:
            _log.warning("recall_flush_failed", error_type=type(exc).__name__, at="close")


_UUIDS = ARRAY(UUID)


def _upsert(tenant_id: uuid.UUID, ids: list[uuid.UUID], on: date) -> Insert:
    ids_column = func.unnest(cast(literal(ids, _UUIDS), _UUIDS)).column_valued("memory_id")
    rows = select(
        cast(literal(tenant_id, UUID), UUID).label("tenant_id"),
        ids_column,
        cast(literal(on, Date), Date).label("recalled_on"),
    )
    statement = insert(MemoryRecall).from_select(["tenant_id", "memory_id", "recalled_on"], rows)
    return statement.on_conflict_do_update(
        index_elements=[MemoryRecall.tenant_id, MemoryRecall.memory_id],
        set_={"recalled_on": statement.excluded.recalled_on},
        where=MemoryRecall.recalled_on < statement.excluded.recalled_on,
    )
