"""`memgate serve --workers 2` through a real process: two worker processes under the parent,
both answering on the one port (each counts its own requests on its own metrics port), the
periodic checkpoint signer still signing (once), and SIGTERM to the parent stopping every worker
and then the embedded database."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.cli.test_embedded_lifecycle import (
    Server,
    _alive,
    _free_port,
    _postmaster_pid,
)

REQUESTS = "http_server_request_duration_seconds_count"


def _children(pid: int) -> list[int]:
    """The worker processes (spawned interpreters) whose parent is `pid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except (FileNotFoundError, ProcessLookupError):
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid and b"spawn_main" in cmdline and _alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def _requests_counted(metrics_url: str) -> float:
    scrape = httpx.get(metrics_url, timeout=5)
    assert scrape.status_code == 200, scrape.text
    return sum(
        sample.value
        for family in text_string_to_metric_families(scrape.text)
        for sample in family.samples
        if sample.name == REQUESTS
    )


def _all_workers_up(server: Server) -> None:
    """/readyz answers once one worker accepts; the banner waits for all of them."""
    deadline = time.monotonic() + 120
    while b"memgate is ready" not in server.output.read_bytes():
        assert time.monotonic() < deadline, server.output.read_text()
        time.sleep(0.2)


@pytest.fixture
def two_workers() -> Iterator[tuple[Server, int]]:
    root = Path(tempfile.mkdtemp(prefix="memgate-cli-"))
    data_dir = root / "data"
    port, metrics_port = _free_port(), _free_port()
    while _free_port() == metrics_port + 1:  # pragma: no cover (the next port must be free)
        metrics_port = _free_port()
    env = {
        **os.environ,
        "MEMGATE_DATA_DIR": str(data_dir),
        "MEMGATE_HOST": "127.0.0.1",
        "MEMGATE_PORT": str(port),
        "MEMGATE_METRICS_PORT": str(metrics_port),  # worker 1 takes the next one
        "MEMGATE_AUDIT_CHECKPOINT_SECONDS": "1",
    }
    for name in ("DATABASE_URL", "MEMGATE_MIGRATION_DATABASE_URL", "MEMGATE_WORKERS"):
        env.pop(name, None)
    served = Server(data_dir, port, env, serve_args=("--workers", "2"))
    try:
        yield served, metrics_port
    finally:
        served.kill_everything()
        shutil.rmtree(root, ignore_errors=True)


def _started_with_two_workers(server: Server) -> tuple[list[int], int]:
    """Start the serve; its two worker pids and the embedded postmaster's, once all answer."""
    server.start()
    _all_workers_up(server)
    assert server.process is not None
    workers = _children(server.process.pid)
    assert len(workers) == 2, workers
    postmaster = _postmaster_pid(server.data_dir)
    assert postmaster is not None
    return workers, postmaster


def test_two_workers_both_answer_and_sigterm_stops_them_and_the_database(
    two_workers: tuple[Server, int],
) -> None:
    server, metrics_port = two_workers
    workers, postmaster = _started_with_two_workers(server)
    server.assert_serving()
    token = server.run("token")
    assert token.returncode == 0, token.stderr
    headers = {"Authorization": f"Bearer {token.stdout.strip()}"}

    # A new connection per request: the kernel hands each to whichever worker accepts first.
    metrics = [f"http://127.0.0.1:{metrics_port + i}/metrics" for i in range(2)]
    before = [_requests_counted(url) for url in metrics]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for _ in range(20):
            answer = httpx.get(f"{server.url}/v1/principals", headers=headers, timeout=10)
            assert answer.status_code == 200, answer.text
        if all(_requests_counted(url) > was for url, was in zip(metrics, before, strict=True)):
            break
    counted = [_requests_counted(url) - was for url, was in zip(metrics, before, strict=True)]
    assert all(n > 0 for n in counted), f"a worker answered nothing: {counted}"

    # Worker 0 alone runs the periodic signer: a checkpoint appears, nobody raced for it.
    deadline = time.monotonic() + 30
    latest = httpx.get(f"{server.url}/v1/audit/checkpoints/latest", headers=headers, timeout=10)
    while latest.status_code != 200 and time.monotonic() < deadline:
        time.sleep(0.5)
        latest = httpx.get(f"{server.url}/v1/audit/checkpoints/latest", headers=headers, timeout=10)
    assert latest.status_code == 200, latest.text
    assert latest.json()["seq"] > 0

    assert server.process is not None
    os.kill(server.process.pid, signal.SIGTERM)
    assert server.wait() == 0
    assert not any(_alive(pid) for pid in workers), "a worker outlived serve"
    assert not _alive(postmaster), "the embedded PostgreSQL was left running"
    assert _postmaster_pid(server.data_dir) is None
    output = server.output.read_text()
    assert "audit_checkpoint_seq_taken" not in output, output
    assert "ERROR" not in output, output
    assert "Traceback" not in output, output


def test_a_worker_that_dies_stops_the_serve_and_its_database(
    two_workers: tuple[Server, int],
) -> None:
    """Not a serve limping on with fewer workers than configured: the parent stops the rest
    and the embedded database and exits 1, for its supervisor to restart it."""
    server, _ = two_workers
    workers, postmaster = _started_with_two_workers(server)
    os.kill(workers[0], signal.SIGKILL)
    assert server.wait() == 1
    assert not any(_alive(pid) for pid in workers), "a worker outlived serve"
    assert not _alive(postmaster), "the embedded PostgreSQL was left running"
    output = server.output.read_text()
    assert "memgate-worker-" in output
    assert "exited (-9); stopping." in output, output
