"""`memgate serve --workers N`: how many worker processes, and their supervision by the parent.

The parent does everything that must happen once (the embedded database, migrations, keys,
bootstrap, the TLS certificate, the banner; with `--no-migrate` it checks the migration Job did
the owner's part instead) and binds the public socket; each worker is a fresh interpreter (spawn,
not fork: the parent's threads, locks, pools and OpenTelemetry providers do not survive a fork)
that builds its own runtime and app and accepts on that socket. See docs/architecture.md,
"Serving".
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import queue
import signal
import socket
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field, replace
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from typing import Any

import psycopg
import structlog

from service.audit.group_commit import GROUP_COMMIT_POOL_SIZE
from service.db.replica import REPLICA_SAMPLER_CONNECTIONS
from service.quotas.limiter import QUOTA_CONNECTIONS
from service.settings import Settings

_log = structlog.get_logger("memgate.serve")
CONNECTIONS_PER_WORKER_FACTOR = 2
"""A worker's pool holds up to `2 * MEMGATE_DB_POOL_SIZE` (pool plus overflow, db/session.py)."""
GROUP_COMMIT_CONNECTIONS = 2 * GROUP_COMMIT_POOL_SIZE
"""Plus the pool of its reads' audit group commit (service/audit/group_commit.py)."""
SPARE_CONNECTIONS = 5
"""Left free for the other `memgate` commands run beside a serve (migrate, token, checkpoint)."""
STOP_SECONDS = 30.0
"""How long a worker may take to drain before it is killed."""


class WorkersDoNotFit(SystemExit):
    """More workers were asked for than the database's connections can hold."""


def connection_budget(owner_url: str) -> int | None:
    """Connections a new client may still open: max_connections less the reserved slots and the
    client connections open now. None when the server will not say (a pooler in front)."""
    try:
        # visible: ok reads server settings and pg_stat_activity only
        with psycopg.connect(owner_url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT current_setting('max_connections')::int"
                " - current_setting('superuser_reserved_connections')::int"
                " - coalesce(current_setting('reserved_connections', true), '0')::int"
                " - (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')"
            ).fetchone()
    except psycopg.Error as exc:
        _log.warning("connection_budget_unknown", error_type=type(exc).__name__)
        return None
    return None if row is None else int(row[0]) + 1  # this check's own connection closes


def connections_per_worker(pool_size: int, *, read_replica: bool = False) -> int:
    """Pool and overflow, the group commit's pool, and the quota limiter's one connection; with
    a read replica, its sampler's one connection too (service/db/replica.py; the replica's own
    pool is on the standby, not counted here)."""
    sampler = REPLICA_SAMPLER_CONNECTIONS if read_replica else 0
    return (
        CONNECTIONS_PER_WORKER_FACTOR * pool_size
        + GROUP_COMMIT_CONNECTIONS
        + QUOTA_CONNECTIONS
        + sampler
    )


def worker_count(
    requested: int, cores: int, pool_size: int, budget: int | None, *, read_replica: bool = False
) -> int:
    """How many workers to start. `requested` 0 means one per core, lowered to what `budget`
    connections hold (at least one); an explicit count that does not fit is refused, naming the
    settings that fix it."""
    per_worker = connections_per_worker(pool_size, read_replica=read_replica)
    fits = None if budget is None else max(0, budget - SPARE_CONNECTIONS) // per_worker
    if requested == 0:
        return max(1, cores if fits is None else min(cores, fits))
    if requested > 1 and fits is not None and requested > fits:
        raise WorkersDoNotFit(
            f"memgate serve: {requested} workers with MEMGATE_DB_POOL_SIZE={pool_size} may open "
            f"{requested * per_worker} database connections, but the database has room for "
            f"{max(0, (budget or 0) - SPARE_CONNECTIONS)} (max_connections less reserved and "
            f"open ones, less {SPARE_CONNECTIONS} spare). Lower MEMGATE_WORKERS or "
            "MEMGATE_DB_POOL_SIZE, or raise max_connections."
        )
    return requested


@dataclass
class Workers:
    """The worker processes of one serve. `target(index, sock, ready)` is a worker's body; it
    puts its index on `ready` once it accepts connections."""

    target: Callable[..., None]
    args: Callable[[int], tuple[Any, ...]]
    """The arguments after (index, sock, ready) for worker `index` (picklable)."""
    sock: socket.socket
    _context: Any = field(default_factory=lambda: multiprocessing.get_context("spawn"))
    _processes: list[BaseProcess] = field(default_factory=list)
    _ready: Any = None

    def start(self, count: int) -> None:
        self._ready = self._context.Queue()
        for index in range(count):
            process = self._context.Process(
                target=self.target,
                args=(index, self.sock, self._ready, *self.args(index)),
                name=f"memgate-worker-{index}",
            )
            process.start()
            self._processes.append(process)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._processes if p.pid is not None]

    def wait_ready(self, timeout: float) -> bool:
        """True once every worker accepts; False when one exited first or time ran out."""
        waiting = set(range(len(self._processes)))
        deadline = time.monotonic() + timeout
        while waiting and time.monotonic() < deadline:
            try:
                waiting.discard(self._ready.get(timeout=0.2))
            except queue.Empty:
                if any(not p.is_alive() for p in self._processes):
                    return False
        return not waiting

    def wait_for_an_exit(self) -> BaseProcess:
        """Block until a worker exits (a signal to this process interrupts the wait)."""
        while True:
            for process in self._processes:
                if not process.is_alive():
                    return process
            wait([p.sentinel for p in self._processes])

    def stop(self) -> None:
        """SIGTERM every worker and wait while they drain; one still up after STOP_SECONDS is
        killed. A worker already draining (a terminal's Ctrl-C or hang-up reaches the whole
        process group) is not hurried by it: to uvicorn only a second SIGINT forces an exit."""
        alive = [p for p in self._processes if p.is_alive()]
        for process in alive:
            if process.pid is not None:
                os.kill(process.pid, signal.SIGTERM)
        _join(alive, STOP_SECONDS)
        for process in alive:
            if process.is_alive():
                _log.warning("worker_killed", worker=process.name, after_seconds=STOP_SECONDS)
                process.kill()
                process.join()
        if self._ready is not None:
            self._ready.close()
            self._ready.join_thread()


def _join(processes: list[BaseProcess], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))


def worker_settings(settings: Settings, index: int) -> Settings:
    """What worker `index` runs with: its own metrics port (MEMGATE_METRICS_PORT + index; a
    scrape covers that worker only), and the periodic checkpoint signer in worker 0 only. The
    signer is safe to run twice (one checkpoint per (tenant, seq), the loser's insert is
    refused), but every worker after the first would only sign nothing, and log a spurious
    `audit_checkpoint_seq_taken` when it raced the first."""
    observability = settings.observability
    metrics_port = observability.metrics_port + index if observability.metrics_port else 0
    signer_every = settings.audit.checkpoint_seconds if index == 0 else 0
    return replace(
        settings,
        observability=replace(observability, metrics_port=metrics_port),
        audit=replace(settings.audit, checkpoint_seconds=signer_every),
    )


ORPHAN_CHECK_SECONDS = 1.0
"""How often a worker checks that the `serve` that started it still runs."""


async def _exit_when_orphaned(parent: int) -> None:
    """A worker whose parent died without stopping it (SIGKILL, OOM) exits within a second,
    instead of serving on, unsupervised, on the socket it inherited: nothing would ever stop
    it, and the next `serve` would find its port taken."""
    while os.getppid() == parent:  # noqa: ASYNC110 (no event tells a process its parent died)
        await asyncio.sleep(ORPHAN_CHECK_SECONDS)
    _log.error("worker_orphaned", parent=parent)
    os._exit(1)


def serve_worker(index: int, sock: socket.socket, ready: Any, settings: Settings, url: str) -> None:
    """A worker process's body (spawned, so it sets up logging and telemetry itself): its own
    runtime (pool, verifier, embedder) and app on the parent's socket, until SIGTERM, SIGINT or
    SIGHUP. Keys, migrations and bootstrap are the parent's."""
    # From the command's module by name: spawned from `python -m service`, the child does not
    # re-run that `__main__` (multiprocessing skips a package's __main__), so it imports it.
    from service.__main__ import Stopped, _listen, _runtime, _stopped_by_signals
    from service.http.server import run_on_uvloop
    from service.observability.logging import configure_logging
    from service.observability.telemetry import configure_telemetry

    # Each worker pushes (OTLP) as its own instance, so a collector does not add up N cumulative
    # series under one identity as if they were one.
    os.environ["OTEL_RESOURCE_ATTRIBUTES"] = ",".join(
        part
        for part in (
            os.environ.get("OTEL_RESOURCE_ATTRIBUTES", ""),
            f"service.instance.id={socket.gethostname()}-{os.getpid()}",
        )
        if part
    )

    parent = os.getppid()

    async def main() -> None:
        watch = asyncio.create_task(_exit_when_orphaned(parent))
        runtime = await _runtime(settings, url, None)
        try:
            await _listen(settings, runtime, lambda: ready.put(index), sock, worker=True)
        finally:
            watch.cancel()
            await runtime.close()

    # The stop signals first: the parent may stop a worker that is still starting.
    with _stopped_by_signals(), suppress(KeyboardInterrupt, Stopped):
        configure_logging(json_logs=settings.server.json_logs)
        configure_telemetry(settings.observability)
        # On the lines logged outside a request (start-up, the checkpoint signer's task);
        # a request's lines are bound afresh by the access-log middleware.
        structlog.contextvars.bind_contextvars(worker=index)
        run_on_uvloop(main())
