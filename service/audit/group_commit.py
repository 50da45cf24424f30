"""Group commit of read calls' audit rows: many readers' rows share one transaction and one
fsync, in arrival order, and each reader is answered only once its row is durable.

A read changes nothing, so its row need not share the read's transaction; it must only be
committed before the answer (promise: a call is never answered unaudited). Appending it in the
read's own transaction made every search a write transaction: one fsync each, and the tenant's
chain lock (taken by `audit_append()`, held until commit) serialised every reader of a tenant
across all workers. Here one flusher per process takes every row waiting, appends them in one
transaction (per-tenant chain order is the order they arrived, under the same lock) and commits
once; rows that arrive meanwhile wait for the next flush. If the batch fails, every row in it
fails together and each call falls back to appending its row on its own.
"""

from __future__ import annotations

import asyncio
import contextvars
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from service.audit.rows import RowSource, append_row
from service.db.session import create_sessionmaker
from service.db.tenancy import name_tenant
from service.observability.telemetry import span

if TYPE_CHECKING:
    from service.runtime import Runtime

GROUP_COMMIT_POOL_SIZE = 1
"""The group's own pool: one flush runs at a time (its overflow covers a reconnect)."""
MAX_BATCH = 256
"""Rows per transaction at most: bounds how long one flush holds a chain's lock."""

Receipt = tuple[uuid.UUID, int, bytes]


@dataclass
class _Pending:
    source: RowSource
    done: asyncio.Future[Receipt]


class GroupCommitUnconfirmed(Exception):
    """COMMIT of a group was sent and not confirmed: its rows may be in the log. The calls must
    not append them again (they would be there twice); they answer as a write whose commit was
    not confirmed does."""


class ReadAuditQueue:
    """One per process (per `Runtime`). A plain class, not a dataclass: Litestar's signature
    model walks dataclass fields of injected values (the runtime holds this queue)."""

    def __init__(self, engine: AsyncEngine) -> None:
        """`engine`: the group's own pool (one connection in use at a time)."""
        self._engine = engine
        self._sessionmaker = create_sessionmaker(engine)
        self._waiting: list[_Pending] = []
        self._flusher: asyncio.Task[None] | None = None
        self.flushes = 0
        """Transactions committed (for the bench and tests: rows ÷ flushes is the batch size)."""

    async def append(self, runtime: Runtime, source: RowSource) -> Receipt:
        """Append `source`'s row in the next group; returns (chain, seq, hash) once committed,
        or raises what failed the group."""
        done: asyncio.Future[Receipt] = asyncio.get_running_loop().create_future()
        self._waiting.append(_Pending(source, done))
        if self._flusher is None or self._flusher.done():
            # A context of its own: the flush serves many calls, so its spans belong to no
            # one call's trace (each row still names its own call's trace id).
            self._flusher = asyncio.create_task(
                self._flush_all(runtime), context=contextvars.Context()
            )
        # In the call's trace: the time until its row was durable.
        with span("audit.append", {"memgate.audit.path": "group"}):
            return await done

    async def _flush_all(self, runtime: Runtime) -> None:
        while self._waiting:
            batch, self._waiting = self._waiting[:MAX_BATCH], self._waiting[MAX_BATCH:]
            try:
                receipts = await self._flush(runtime, batch)
            except BaseException as exc:  # the group failed: every row in it fails
                failed = batch
                if not isinstance(exc, Exception):  # cancelled (shutdown): nobody is left hanging
                    failed, self._waiting = batch + self._waiting, []
                for pending in failed:
                    if not pending.done.done():
                        pending.done.set_exception(exc)
                if not isinstance(exc, Exception):
                    raise
                continue
            for pending, receipt in zip(batch, receipts, strict=True):
                if not pending.done.done():
                    pending.done.set_result(receipt)

    @staticmethod
    async def _commit(session: AsyncSession) -> None:
        await session.commit()

    @property
    def engine(self) -> AsyncEngine:
        return self._engine

    async def close(self) -> None:
        if self._flusher is not None and not self._flusher.done():
            await asyncio.gather(self._flusher, return_exceptions=True)
        await self._engine.dispose()

    async def _flush(self, runtime: Runtime, batch: list[_Pending]) -> list[Receipt]:
        with span("audit.group_commit", {"memgate.audit.rows": len(batch)}):
            return await self._flush_batch(runtime, batch)

    async def _flush_batch(self, runtime: Runtime, batch: list[_Pending]) -> list[Receipt]:
        # By chain (stable: each chain keeps its arrival order), so two processes' groups take
        # the chains' locks in one order and never deadlock.
        order = sorted(range(len(batch)), key=lambda i: batch[i].source.tenant_id.bytes)
        receipts: dict[int, Receipt] = {}
        named: uuid.UUID | None = None
        async with self._sessionmaker() as session:
            for index in order:
                pending = batch[index]
                tenant = pending.source.tenant_id
                if tenant != named:
                    # `audit_append()` writes only to the tenant the transaction names.
                    await name_tenant(session, tenant)
                    named = tenant
                receipts[index] = await append_row(
                    session, runtime, pending.source, path="group_flush"
                )
            try:
                await self._commit(session)
            except Exception as exc:  # the reply to COMMIT was lost or refused
                raise GroupCommitUnconfirmed() from exc
        self.flushes += 1
        return [receipts[i] for i in range(len(batch))]
