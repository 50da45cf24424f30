"""The embedded PostgreSQL's lifetime, driven through real `memgate` processes: a second command
against a running server's data dir uses its cluster and leaves it running; the server itself
stops it on Ctrl-C, SIGTERM (kill, systemd, docker stop) and SIGHUP, and leaves no orphan."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

MEMGATE = [sys.executable, "-m", "service"]
START_TIMEOUT = 120.0
COMMAND_TIMEOUT = 120.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _postmaster_pid(data_dir: Path) -> int | None:
    pid_file = data_dir / "pgdata" / "postmaster.pid"
    try:
        pid = int(pid_file.read_text().splitlines()[0])
    except (FileNotFoundError, IndexError, ValueError):
        return None
    return pid if pid > 0 else None  # negative: initdb's single-user bootstrap


def _alive(pid: int) -> bool:
    """Running; a zombie (exited, not yet reaped by a container's init) counts as gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@dataclass
class Server:
    data_dir: Path
    port: int
    env: dict[str, str]
    process: subprocess.Popen[str] | None = None
    serve_args: tuple[str, ...] = ()
    output: Path = field(init=False)

    def __post_init__(self) -> None:
        self.output = self.data_dir.parent / f"serve-{self.port}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.process = subprocess.Popen(  # noqa: S603 (our own CLI)
            [*MEMGATE, "serve", *self.serve_args],
            env=self.env,
            stdout=self.output.open("w"),
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # a signal to the group is a terminal's Ctrl-C
        )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.output.read_text()
            with_ready = self.readyz()
            if with_ready == 200:
                return
            time.sleep(0.2)
        pytest.fail(f"memgate serve did not become ready:\n{self.output.read_text()}")

    def readyz(self) -> int | None:
        try:
            return httpx.get(f"{self.url}/readyz", timeout=5).status_code
        except httpx.TransportError:
            return None

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(  # noqa: S603 (our own CLI)
            [*MEMGATE, *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT,
            check=False,
        )

    def wait(self) -> int:
        assert self.process is not None
        return self.process.wait(timeout=COMMAND_TIMEOUT)

    def assert_serving(self) -> None:
        """Ready, and a fresh token works on an authenticated call."""
        assert self.readyz() == 200
        token = self.run("token")
        assert token.returncode == 0, token.stderr
        listed = httpx.get(
            f"{self.url}/v1/principals",
            headers={"Authorization": f"Bearer {token.stdout.strip()}"},
            timeout=10,
        )
        assert listed.status_code == 200, listed.text

    def kill_everything(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
        pid = _postmaster_pid(self.data_dir)
        if pid is not None and _alive(pid):
            os.kill(pid, signal.SIGQUIT)  # immediate shutdown; the test failed already
            deadline = time.monotonic() + 30
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)


@pytest.fixture
def server() -> Iterator[Server]:
    # Not tmp_path: pytest prunes old basetemp dirs of the same user, and parallel runs did so
    # under a running cluster.
    root = Path(tempfile.mkdtemp(prefix="memgate-cli-"))
    data_dir = root / "data"
    port = _free_port()
    env = {
        **os.environ,
        "MEMGATE_DATA_DIR": str(data_dir),
        "MEMGATE_HOST": "127.0.0.1",
        "MEMGATE_PORT": str(port),
        # its own metrics port too: a fixed default would collide with any other serve here
        "MEMGATE_METRICS_PORT": str(_free_port()),
    }
    env.pop("DATABASE_URL", None)
    env.pop("MEMGATE_MIGRATION_DATABASE_URL", None)
    served = Server(data_dir, port, env)
    try:
        yield served
    finally:
        served.kill_everything()
        shutil.rmtree(root, ignore_errors=True)


def test_second_commands_leave_the_running_servers_database_running(server: Server) -> None:
    server.start()
    postmaster = _postmaster_pid(server.data_dir)
    assert postmaster is not None
    for command in (["migrate"], ["keys", "rotate"], ["audit", "checkpoint"], ["serve"]):
        done = server.run(*command)
        if command == ["serve"]:
            assert done.returncode != 0  # the port is taken
        else:
            assert done.returncode == 0, done.stderr
        server.assert_serving()
        assert _postmaster_pid(server.data_dir) == postmaster, command
        assert _alive(postmaster), command
    os.killpg(server.process.pid if server.process else 0, signal.SIGINT)
    assert server.wait() == 0
    assert not _alive(postmaster)


@pytest.mark.parametrize("how", ["SIGINT to the group", "SIGTERM", "SIGHUP"])
def test_a_signal_stops_the_server_and_its_database_cleanly(server: Server, how: str) -> None:
    server.start()
    postmaster = _postmaster_pid(server.data_dir)
    assert postmaster is not None
    assert _alive(postmaster)
    assert server.process is not None
    if how == "SIGINT to the group":
        os.killpg(server.process.pid, signal.SIGINT)
    else:
        os.kill(server.process.pid, getattr(signal, how))
    assert server.wait() == 0
    assert not _alive(postmaster), "the embedded PostgreSQL was left running"
    assert _postmaster_pid(server.data_dir) is None
    output = server.output.read_text()
    assert "ERROR" not in output, output
    assert "Traceback" not in output, output
    assert "killing it instead" not in output, output


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc), but for multiprocessing's tracker."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            command = (stat.parent / "cmdline").read_bytes()
            if int(fields[1]) == pid and b"spawn_main" in command:
                found.append(int(stat.parent.name))
    return found


def test_an_orphaned_cluster_is_adopted_and_stopped(server: Server) -> None:
    """A server killed outright (SIGKILL, OOM) leaves its cluster; the next command takes it
    over, since nothing else owns it, and stops it when done. Its workers do not serve on
    unsupervised: each exits once it finds its parent gone."""
    server.start()
    orphan = _postmaster_pid(server.data_dir)
    assert orphan is not None
    assert server.process is not None
    workers = _children(server.process.pid)
    assert workers  # the fixture's serve runs worker processes
    server.process.kill()
    server.wait()
    assert _alive(orphan)
    deadline = time.monotonic() + 15
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in workers if _alive(pid)]
    done = server.run("migrate")
    assert done.returncode == 0, done.stderr
    deadline = time.monotonic() + 30
    while _alive(orphan) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(orphan)
