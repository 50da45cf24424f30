"""Crash tests (issue 18): `kill -9` under a write load, then a restart. Every write that was
answered 2xx is there exactly once and whole; a client that retries what it was never answered,
with the same `Idempotency-Key`, writes each of those exactly once too; the audit chain
verifies. Real `memgate serve` processes on loopback, on their embedded PostgreSQL.

Bounded: a few writers, at most `WRITES_PER_WRITER` writes each, every call with a timeout."""

from __future__ import annotations

import os
import signal
import threading
import time
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.cli.test_embedded_lifecycle import (
    Server,
    _alive,
    _children,
    _postmaster_pid,
    server,
)

__all__ = ["server"]  # the fixture, used by name

WRITERS = 4
WRITES_PER_WRITER = 200
"""An upper bound: the kill comes long before (after `ACKED_BEFORE_KILL` answers)."""
ACKED_BEFORE_KILL = 40
CALL_TIMEOUT = 10.0
SUBJECT = "service:crash-test"


@dataclass
class Attempt:
    """One write as its client saw it: the key it sent and, if it was answered 2xx, the id."""

    idempotency_key: str
    body: dict[str, Any]
    memory_id: str | None = None


@dataclass
class Load:
    """Writers posting distinct memories, each under its own `Idempotency-Key`, until the
    server stops answering."""

    url: str
    token: str
    attempts: list[Attempt] = field(default_factory=list)
    acked: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    lock: threading.Lock = field(default_factory=threading.Lock)
    stopped_by: list[str] = field(default_factory=list)
    """Why each writer stopped: the error or the answer."""

    def write(self, writer: int) -> None:
        headers = {"Authorization": f"Bearer {self.token}"}
        with httpx.Client(base_url=self.url, timeout=CALL_TIMEOUT) as http:
            for n in range(WRITES_PER_WRITER):
                attempt = Attempt(
                    f"crash-{writer}-{n}",
                    {
                        "subject": SUBJECT,
                        "kind": "fact",
                        "key": f"item-{writer}-{n}",
                        "value": f"the value of item {writer}-{n}, written whole",
                        "new_key": True,
                    },
                )
                with self.lock:
                    self.attempts.append(attempt)
                try:
                    answer = http.post(
                        "/v1/memories",
                        json=attempt.body,
                        headers={**headers, "Idempotency-Key": attempt.idempotency_key},
                    )
                except httpx.TransportError as gone:
                    self.stopped_by.append(repr(gone))
                    return  # the server is gone: this write was never answered
                if answer.status_code != 201:
                    self.stopped_by.append(f"{answer.status_code} {answer.text}")
                    return  # a dying server may answer 503; not acknowledged either
                attempt.memory_id = answer.json()["memory"]["id"]
                self.acked.release()


def _cluster_processes(data_dir: Path) -> list[int]:
    """The embedded PostgreSQL's postmaster and every backend it forked."""
    postmaster = _postmaster_pid(data_dir)
    if postmaster is None:
        return []
    found = [postmaster]
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with suppress(OSError, IndexError, ValueError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == postmaster:
                found.append(int(stat.parent.name))
    return found


def _kill_9(server: Server, *, database_too: bool) -> None:
    """SIGKILL the serve process and its workers at once (and, with `database_too`, every
    process of its cluster: a power cut, as far as one box can stage it)."""
    assert server.process is not None
    victims = [server.process.pid, *_children(server.process.pid)]
    if database_too:
        victims += _cluster_processes(server.data_dir)
    for pid in victims:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    server.process.wait(timeout=30)
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in victims) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in victims if _alive(pid)]


def _live_items(server: Server, token: str) -> dict[str, list[dict[str, Any]]]:
    """key → the live memories under it, over every page of the subject's listing."""
    found: dict[str, list[dict[str, Any]]] = {}
    cursor: str | None = None
    with httpx.Client(base_url=server.url, timeout=CALL_TIMEOUT) as http:
        while True:
            params: dict[str, str | int] = {"subject": SUBJECT, "limit": 100}
            if cursor is not None:
                params["cursor"] = cursor
            page = http.get(
                "/v1/memories", params=params, headers={"Authorization": f"Bearer {token}"}
            )
            assert page.status_code == 200, page.text
            for item in page.json()["items"]:
                found.setdefault(item["key"], []).append(item)
            cursor = page.json()["next_cursor"]
            if cursor is None:
                return found


@pytest.mark.parametrize("database_too", [False, True], ids=["the app", "the app and its database"])
def test_kill_9_under_writes_loses_nothing_acknowledged_and_retries_write_once(
    server: Server, database_too: bool
) -> None:
    server.start()
    token = server.run("token").stdout.strip()
    load = Load(server.url, token)
    writers = [threading.Thread(target=load.write, args=(n,)) for n in range(WRITERS)]
    for writer in writers:
        writer.start()
    for _ in range(ACKED_BEFORE_KILL):
        assert load.acked.acquire(timeout=60), load.stopped_by
    _kill_9(server, database_too=database_too)
    for writer in writers:
        writer.join(timeout=2 * CALL_TIMEOUT)
        assert not writer.is_alive()

    server.start()  # adopts (or crash-recovers) the cluster
    token = server.run("token").stdout.strip()
    acked = {a.idempotency_key: a.memory_id for a in load.attempts if a.memory_id is not None}
    unanswered = [a for a in load.attempts if a.memory_id is None]
    assert len(acked) >= ACKED_BEFORE_KILL
    assert unanswered, "the kill came after every write was answered"
    # What the server answered before it died is there, once, and whole.
    live = _live_items(server, token)
    for attempt in load.attempts:
        if attempt.memory_id is not None:
            (kept,) = live[attempt.body["key"]]
            assert kept["id"] == attempt.memory_id
            assert kept["value"] == attempt.body["value"]
    # A client retrying what it was never answered, under the same keys, writes each once:
    # a write the server committed but never answered is replayed, the others are written.
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=server.url, timeout=CALL_TIMEOUT) as http:
        for attempt in unanswered:
            retried = http.post(
                "/v1/memories",
                json=attempt.body,
                headers={**headers, "Idempotency-Key": attempt.idempotency_key},
            )
            assert retried.status_code == 201, retried.text
            attempt.memory_id = retried.json()["memory"]["id"]
    live = _live_items(server, token)
    assert sorted(live) == sorted(a.body["key"] for a in load.attempts)
    for attempt in load.attempts:
        (kept,) = live[attempt.body["key"]]
        assert (kept["id"], kept["value"]) == (attempt.memory_id, attempt.body["value"])
    # The audit chain holds across the crash.
    verified = httpx.get(f"{server.url}/v1/audit/verify", headers=headers, timeout=CALL_TIMEOUT)
    assert verified.status_code == 200, verified.text
    assert verified.json()["ok"] is True, verified.json()
    print(  # the crash-test counts the closing note reports (pytest -s)
        f"crash ({'app and database' if database_too else 'app'}): {len(load.attempts)} "
        f"writes sent, {len(acked)} acknowledged, {len(acked)} found, "
        f"{len(unanswered)} unanswered retried, {len(live)} live in all"
    )
