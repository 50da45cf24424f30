"""Statements (round trips to PostgreSQL) per request of a real `memgate serve`, per checkout.

    .venv/bin/python -m bench.statements_per_request [--checkout PATH ...] [--requests 10]

For each checkout (default: this one) it starts `memgate serve --workers 1` with a fresh data
directory (bench.http_load's harness), follows the README's first steps, writes 30 memories,
then turns on PostgreSQL's statement log (`log_min_duration_statement = 0`, as the cluster's
superuser over its socket) and sends `--requests` searches, writes and refused reads (a GET of
an id that does not exist) one at a time. Every statement the server runs is a round trip:
simple-protocol commands (BEGIN, COMMIT, ROLLBACK, the pool's ping) and executed extended-protocol
statements are counted, per request, whoever sent them (the call, its audit row, the group
commit). Deterministic, so one run is enough.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import httpx
import psycopg

from bench.http_load import HERE, Served, agent_token, served

KINDS = ("search", "write", "refused read")


def _logged(log: Path, start: int) -> tuple[int, int]:
    """Statements logged after byte `start`, and where the log ends now."""
    text = log.read_text()[start:]
    lines = [
        line
        for line in text.splitlines()
        if "duration:" in line and (" statement: " in line or " execute " in line)
    ]
    return len(lines), start + len(text)


def _log_every_statement(server: Served) -> Path:
    pid = (server.data_dir / "pgdata" / "postmaster.pid").read_text().splitlines()
    with psycopg.connect(
        host=pid[4], port=pid[3], dbname="postgres", user="postgres", autocommit=True
    ) as owner:
        owner.execute("ALTER SYSTEM SET log_min_duration_statement = 0")
        owner.execute("SELECT pg_reload_conf()")
    time.sleep(1.0)
    return server.data_dir / "pgdata" / "log"


def _send(http: httpx.Client, kind: str, i: int, headers: dict[str, str]) -> int:
    if kind == "search":
        body = {"query": f"what does the service {i} do", "k": 5}
        return http.post("/v1/memories/search", json=body, headers=headers).status_code
    if kind == "write":
        fact = {"subject": f"service:w{i}", "kind": "fact", "key": "note", "value": f"note {i}"}
        return http.post("/v1/memories", json=fact, headers=headers).status_code
    missing = f"00000000-0000-7000-8000-{i:012d}"
    return http.get(f"/v1/memories/{missing}", headers=headers).status_code


def measure(checkout: Path, requests: int) -> dict[str, float]:
    counts: dict[str, float] = {}
    with served(checkout, 1) as server:
        headers = {"Authorization": f"Bearer {agent_token(server)}"}
        with httpx.Client(base_url=server.url, timeout=30) as http:
            for i in range(30):
                fact = {"subject": f"service:{i}", "kind": "fact", "key": "k", "value": f"x {i}"}
                http.post("/v1/memories", json=fact, headers=headers).raise_for_status()
            log = _log_every_statement(server)
            for kind in KINDS:
                _, start = _logged(log, 0)
                statuses = {_send(http, kind, i, headers) for i in range(requests)}
                time.sleep(0.5)  # the log is written asynchronously
                counted, _ = _logged(log, start)
                counts[kind] = counted / requests
                print(f"  {kind:<13} {counts[kind]:5.1f} statements a request (status {statuses})")
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--checkout", type=Path, action="append")
    parser.add_argument("--requests", type=int, default=10)
    args = parser.parse_args()
    for checkout in args.checkout or [HERE]:
        print(checkout)
        measure(checkout.resolve(), args.requests)


if __name__ == "__main__":
    main()
