"""The optional read replica: where read-only calls run when it is fresh enough, and the bound.

**The bound.** A background task samples the primary's `pg_current_wal_lsn()` every half bound
on a one-connection pool of its own, noting when each sample was *sent* (the position it
returns covers every commit before that moment). A routed call asks the replica, in its first
statement (the entrance that names the caller anyway: no extra round trip), whether
`pg_last_wal_replay_lsn()` has reached the oldest sample sent within the last bound. When it
has, every change the primary had committed `max_lag` before the call began is visible there,
so is every disabled client and tenant, revoked grant and deleted memory; when it has not, or
no such sample exists (the sampler cannot reach the primary, or just started), or the replica
fails, the call runs on the primary: a fallback, counted, never an error.

**Read-your-writes, per process.** After this process commits a write, its reads need a
sample sent after that commit (at most half a bound later): until the sampler has one, they
run on the primary. Another process's writes are covered by the bound only.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter, deque
from typing import Any

import structlog
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.types import UserDefinedType

from service.db.session import create_sessionmaker
from service.observability.telemetry import READ_ROUTE

_log = structlog.get_logger("memgate.replica")

RETRY_AFTER_FAILURE_SECONDS = 5.0
"""A replica that failed (refused, timed out, errored) is not tried again for this long: a
dead standby must not add a connection attempt to every read."""
CONNECT_TIMEOUT_SECONDS = 2
"""The replica pool's connect timeout: a blackholed standby costs one read this long, then
`RETRY_AFTER_FAILURE_SECONDS` of reads on the primary."""

REPLICA_SAMPLER_CONNECTIONS = 1
"""The sampler's pool on the primary (no overflow), per process."""

_CURRENT_LSN = text("SELECT pg_current_wal_lsn()::text")


class PgLsn(UserDefinedType[str]):
    """PostgreSQL's `pg_lsn`, bound as text (`'0/16B3748'`) and compared on the server."""

    cache_ok = True

    def get_col_spec(self, **_: Any) -> str:
        return "pg_lsn"


class ReadReplica:
    """One per process (per `Runtime`). A plain class, not a dataclass: Litestar's signature
    model walks dataclass fields of injected values (the runtime holds this)."""

    def __init__(self, engine: AsyncEngine, primary_probe: AsyncEngine, max_lag: float) -> None:
        """`engine`: the replica's pool; `primary_probe`: a one-connection pool on the primary
        for the samples; `max_lag`: the bound, in seconds."""
        self.engine = engine
        self.sessionmaker: async_sessionmaker[AsyncSession] = create_sessionmaker(engine)
        self._probe = primary_probe
        """One connection (`REPLICA_SAMPLER_CONNECTIONS`) on the primary, for the samples."""
        self.max_lag = max_lag
        self._samples: deque[tuple[float, str]] = deque()
        self._last_write = float("-inf")
        self._down_until = float("-inf")
        self._sampler: asyncio.Task[None] | None = None
        self.served = 0
        """Calls the replica answered (tests and the bench read it; `/metrics` has the same)."""
        self.fallbacks: Counter[str] = Counter()
        """Read-only calls run on the primary instead, by reason."""

    def start(self) -> None:
        """Start sampling (once; in the event loop that serves the calls)."""
        if self._sampler is None:
            self._sampler = asyncio.create_task(self._sample_forever())

    async def close(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler
        await self.engine.dispose()
        await self._probe.dispose()

    async def _sample_forever(self) -> None:
        interval = self.max_lag / 2
        while True:
            started = time.monotonic()
            await self.sample()
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))

    async def sample(self) -> None:
        """One sample of the primary's WAL position. A failure keeps the older samples, which
        age out of the bound: reads then run on the primary (which is failing too, or not)."""
        sent = time.monotonic()
        try:
            async with self._probe.connect() as connection:
                lsn = (await connection.execute(_CURRENT_LSN)).scalar_one()
        except Exception as exc:
            _log.warning("primary_lsn_sample_failed", error_type=type(exc).__name__)
            return
        self.note_sample(sent, str(lsn))

    def note_sample(self, sent: float, lsn: str) -> None:
        """The primary was at `lsn` (or later) when a sample was sent at `sent` (monotonic).
        Samples older than the bound go, but the newest is always kept."""
        self._samples.append((sent, lsn))
        oldest_useful = time.monotonic() - self.max_lag
        while len(self._samples) > 1 and self._samples[0][0] < oldest_useful:
            self._samples.popleft()

    def wrote(self) -> None:
        """This process committed a write: its reads need a sample sent after now."""
        self._last_write = time.monotonic()

    def required_lsn(self) -> tuple[str | None, str]:
        """The position the replica must have replayed for a call beginning now, or None and
        why the call runs on the primary instead."""
        now = time.monotonic()
        if now < self._down_until:
            return None, "replica-failed-recently"
        window_start = now - self.max_lag
        after_write = [s for s in self._samples if s[0] > self._last_write]
        if not after_write and self._samples and self._samples[-1][0] >= window_start:
            return None, "own-write"
        for sent, lsn in after_write:
            if sent >= window_start:
                return lsn, ""
        return None, "no-recent-sample"

    def answered(self) -> None:
        self.served += 1
        READ_ROUTE.add(1, {"memgate.db.route": "replica"})

    def fell_back(self, reason: str) -> None:
        self.fallbacks[reason] += 1
        READ_ROUTE.add(1, {"memgate.db.route": "primary", "memgate.db.route.reason": reason})

    def failed(self, error: BaseException) -> None:
        """The replica could not answer the first statement: reads skip it for a while."""
        self._down_until = time.monotonic() + RETRY_AFTER_FAILURE_SECONDS
        _log.warning("read_replica_failed", error_type=type(error).__name__)
