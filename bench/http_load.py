"""Searches/s and writes/s of a real `memgate serve` over loopback, and CPU per request.

    .venv/bin/python -m bench.http_load [--workers 1,2] [--checkout PATH ...]
        [--concurrency 1,4,16,64] [--duration 5] [--requests 2000] [--memories 1000]

For each checkout (default: this one) and worker count, it starts `memgate serve` as a
subprocess with a fresh MEMGATE_DATA_DIR (embedded PostgreSQL, audit on as always), follows the
README's first steps (the bootstrap admin's token, a principal, an agent client with read, write
and delete, its token), writes `--memories` memories, then at each concurrency runs searches
(k=10, varied queries) and then writes (distinct keys, so no supersede chain) for `--duration`
seconds or `--requests` requests, whichever ends first. The load comes from a separate process:
`concurrency` keep-alive HTTP/1.1 connections on uvloop, each one request at a time, so the
client costs little CPU (it still shares the machine's cores with the server).

CPU ms/req: CPU time (user + system, from /proc) of the server's process tree (the serve
parent, its workers) plus the embedded PostgreSQL's (postmaster and backends; a backend that
exited is counted through the postmaster's cutime), over the level, divided by the requests.

Another checkout ("before"): `git worktree add /tmp/memgate-before <commit>`, then
`--checkout /tmp/memgate-before`. Its own `.venv/bin/python` is used if it has one; otherwise
this interpreter with PYTHONPATH set to that checkout (its code, these dependencies). A checkout
whose `serve` has no `--workers` flag runs with one process only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from memgate_client import ClientCredentials, Memgate

from bench.corpus import sentences

HERE = Path(__file__).resolve().parent.parent
START_SECONDS = 180.0
REQUEST_SECONDS = 30.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
SCOPES = "read:memory write:memory delete:memory"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


# --- the load generator (runs in its own process) ------------------------------------------


@dataclass(frozen=True)
class Level:
    port: int
    token: str
    kind: str  # "search" or "write"
    concurrency: int
    requests: int
    seconds: float
    seed: int


@dataclass
class Outcome:
    latencies: list[float] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    elapsed: float = 0.0


def _body(level: Level, i: int, texts: list[str]) -> bytes:
    text = texts[i % len(texts)]
    if level.kind == "search":
        return json.dumps({"query": text, "k": 10}).encode()
    return json.dumps(
        {
            # One subject per write (distinct facts: the write gate lets each through).
            "subject": f"service:{level.seed}.{i}",
            "kind": "fact",
            "key": f"load.{level.seed}.{i}",
            "value": text,
        }
    ).encode()


def _request(level: Level, body: bytes) -> bytes:
    path = "/v1/memories/search" if level.kind == "search" else "/v1/memories"
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{level.port}\r\n"
        f"Authorization: Bearer {level.token}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _answer(reader: asyncio.StreamReader) -> int:
    """Read one response; its status. Content-Length only (memgate never chunks these)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    await reader.readexactly(length)
    return status


async def _drive(level: Level) -> Outcome:
    texts = sentences(500, seed=level.seed)
    outcome = Outcome()
    issued = 0
    deadline = time.monotonic() + level.seconds

    async def connection() -> None:
        nonlocal issued
        reader, writer = await asyncio.open_connection("127.0.0.1", level.port)
        try:
            while issued < level.requests and time.monotonic() < deadline:
                i, issued = issued, issued + 1
                request = _request(level, _body(level, i, texts))
                began = time.perf_counter()
                writer.write(request)
                status = await asyncio.wait_for(_answer(reader), REQUEST_SECONDS)
                outcome.latencies.append(time.perf_counter() - began)
                outcome.statuses[status] += 1
        finally:
            writer.close()

    began = time.perf_counter()
    await asyncio.gather(*(connection() for _ in range(level.concurrency)))
    outcome.elapsed = time.perf_counter() - began
    return outcome


def _drive_in_process(level: Level, results: Any) -> None:
    import uvloop

    results.put(uvloop.run(_drive(level)))


def run_level(level: Level) -> Outcome:
    """One level from a separate process (the client's CPU is not the server's)."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    driver = context.Process(target=_drive_in_process, args=(level, results))
    driver.start()
    try:
        outcome: Outcome = results.get(timeout=level.seconds + START_SECONDS)
    finally:
        driver.join(REQUEST_SECONDS)
        if driver.is_alive():
            driver.kill()
    return outcome


# --- CPU of the server's process tree -------------------------------------------------------


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds incl. reaped children) of `pid`, None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # after the name: state ppid ... utime(12) stime(13) cutime(14) cstime(15)
    ticks = sum(int(value) for value in fields[11:15])
    return int(fields[1]), ticks / CLOCK_TICKS


def tree_pids(roots: list[int]) -> dict[int, float]:
    """Every live process under `roots` (themselves included): pid → its CPU seconds."""
    stats = {int(p.name): _stat(int(p.name)) for p in Path("/proc").iterdir() if p.name.isdigit()}
    children: dict[int, list[int]] = {}
    for pid, stat in stats.items():
        if stat is not None:
            children.setdefault(stat[0], []).append(pid)
    found: dict[int, float] = {}
    pending = list(roots)
    while pending:
        pid = pending.pop()
        stat = stats.get(pid)
        if pid in found or stat is None:
            continue
        found[pid] = stat[1]
        pending += children.get(pid, [])
    return found


def tree_cpu(roots: list[int]) -> float:
    return sum(tree_pids(roots).values())


# --- one server ------------------------------------------------------------------------------


@dataclass
class Served:
    process: subprocess.Popen[bytes]
    data_dir: Path
    port: int
    python: list[str]
    env: dict[str, str]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def roots(self) -> list[int]:
        pid_file = self.data_dir / "pgdata" / "postmaster.pid"
        postmaster = int(pid_file.read_text().splitlines()[0])
        return [self.process.pid, postmaster]


def _python_for(checkout: Path) -> tuple[list[str], dict[str, str]]:
    own = checkout / ".venv" / "bin" / "python"
    env = dict(os.environ)
    if own.exists():
        return [str(own)], env
    env["PYTHONPATH"] = str(checkout)
    return [sys.executable], env


def supports_workers(checkout: Path) -> bool:
    python, env = _python_for(checkout)
    helped = subprocess.run(  # noqa: S603 (our own CLI)
        [*python, "-m", "service", "serve", "--help"],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return "--workers" in helped.stdout


@contextmanager
def served(
    checkout: Path, workers: int, extra_env: dict[str, str] | None = None
) -> Iterator[Served]:
    root = Path(tempfile.mkdtemp(prefix="memgate-load-"))
    python, env = _python_for(checkout)
    port = _free_port()
    env.update(
        MEMGATE_DATA_DIR=str(root / "data"),
        MEMGATE_HOST="127.0.0.1",
        MEMGATE_PORT=str(port),
        MEMGATE_METRICS_PORT="0",
        MEMGATE_WORKERS=str(workers),
        MEMGATE_JSON_LOGS="1",
    )
    env.update(extra_env or {})
    for name in ("DATABASE_URL", "MEMGATE_MIGRATION_DATABASE_URL"):
        env.pop(name, None)
    flags = ["--workers", str(workers)] if workers != 1 else []
    log = (root / "serve.log").open("wb")
    process = subprocess.Popen(  # noqa: S603 (our own CLI)
        [*python, "-m", "service", "serve", *flags],
        cwd=checkout,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    server = Served(process, root / "data", port, python, env)
    try:
        _wait_ready(server, root / "serve.log")
        yield server
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        log.close()
        shutil.rmtree(root, ignore_errors=True)


def _wait_ready(server: Served, log: Path) -> None:
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise SystemExit(f"memgate serve exited:\n{log.read_text()[-4000:]}")
        try:
            ready = httpx.get(f"{server.url}/readyz", timeout=5).status_code == 200
            if ready and b"memgate is ready" in log.read_bytes():  # every worker is up
                return
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    raise SystemExit("memgate serve did not become ready")


def platform_token(server: Served) -> str:
    """The bootstrap (platform) admin's token, as `memgate token` prints it."""
    return subprocess.run(  # noqa: S603 (our own CLI)
        [*server.python, "-m", "service", "token"],
        env=server.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.strip()


def agent_credentials(server: Served) -> ClientCredentials:
    """README "First steps" through the typed client: admin token, a principal, an agent
    client; its credentials."""
    with Memgate(server.url, token=platform_token(server)) as admin:
        user = admin.create_principal(display_name="alice")
        registered = admin.create_client(
            principal_id=user["id"], name="load", scopes=SCOPES.split()
        )
    client = registered["client"]
    return ClientCredentials(client["client_id"], registered["client_secret"], SCOPES)


def issue_token(url: str, credentials: ClientCredentials) -> str:
    with Memgate(url, credentials=credentials) as mg:
        token: str = mg.issue_token()["access_token"]
        return token


def agent_token(server: Served) -> str:
    """The agent's token (README "First steps")."""
    return issue_token(server.url, agent_credentials(server))


# --- the run ---------------------------------------------------------------------------------


@dataclass
class Measured:
    rate: float
    p50: float
    p95: float
    p99: float
    cpu_ms: float
    errors: int


def _percentile(ms: list[float], q: float) -> float:
    return ms[min(len(ms) - 1, round(q * (len(ms) - 1)))]


def measure(server: Served, level: Level) -> Measured:
    before = tree_cpu(server.roots())
    outcome = run_level(level)
    cpu = tree_cpu(server.roots()) - before
    done = len(outcome.latencies)
    ms = sorted(s * 1000 for s in outcome.latencies)
    good = sum(n for status, n in outcome.statuses.items() if 200 <= status < 300)
    return Measured(
        rate=done / outcome.elapsed if outcome.elapsed else 0.0,
        p50=statistics.median(ms) if ms else 0.0,
        p95=_percentile(ms, 0.95) if ms else 0.0,
        p99=_percentile(ms, 0.99) if ms else 0.0,
        cpu_ms=1000 * cpu / done if done else 0.0,
        errors=done - good,
    )


def run(
    label: str, checkout: Path, workers: int, args: argparse.Namespace
) -> list[tuple[int, Measured, Measured]]:
    rows = []
    with served(checkout, workers) as server:
        token = agent_token(server)

        def level(kind: str, concurrency: int, requests: int, seconds: float, seed: int) -> Level:
            return Level(server.port, token, kind, concurrency, requests, seconds, seed)

        seeded = run_level(level("write", 16, args.memories, START_SECONDS, seed=0))
        print(
            f"{label}: seeded {len(seeded.latencies)} memories in {seeded.elapsed:.1f} s "
            f"({dict(seeded.statuses)})",
            flush=True,
        )
        for n, concurrency in enumerate(args.concurrency, start=1):
            search = measure(server, level("search", concurrency, args.requests, args.duration, n))
            write = measure(server, level("write", concurrency, args.requests, args.duration, n))
            rows.append((concurrency, search, write))
            _print_row(label, concurrency, search, write)
    return rows


HEADER = (
    f"{'run':<22} {'conc':>4} | {'search/s':>8} {'p50':>7} {'p95':>7} {'p99':>7} | "
    f"{'writes/s':>8} {'p50':>7} {'p95':>7} {'p99':>7} | {'CPU ms/req s/w':>14} | errors"
)


def _print_row(label: str, concurrency: int, search: Measured, write: Measured) -> None:
    print(
        f"{label:<22} {concurrency:>4} | {search.rate:>8.1f} {search.p50:>7.1f} "
        f"{search.p95:>7.1f} {search.p99:>7.1f} | {write.rate:>8.1f} {write.p50:>7.1f} "
        f"{write.p95:>7.1f} {write.p99:>7.1f} | {search.cpu_ms:>6.1f} / {write.cpu_ms:<5.1f} | "
        f"{search.errors + write.errors}",
        flush=True,
    )


def _ints(raw: str) -> list[int]:
    return [int(part) for part in raw.split(",") if part.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=_ints, default=[1, 2], help="e.g. 1,2 (default)")
    parser.add_argument(
        "--checkout",
        type=Path,
        action="append",
        help="a checkout to serve from (repeat; default this one); e.g. a `git worktree` of an "
        "older commit, printed as 'before' rows",
    )
    parser.add_argument("--concurrency", type=_ints, default=[1, 4, 16, 64])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per level (max)")
    parser.add_argument("--requests", type=int, default=2000, help="requests per level (max)")
    parser.add_argument("--memories", type=int, default=1000, help="written before measuring")
    parser.add_argument("--out", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args()
    checkouts = [c.resolve() for c in (args.checkout or [HERE])]
    print(f"load {os.getloadavg()[0]:.2f}, {os.cpu_count()} cores", flush=True)
    print(HEADER, flush=True)
    results: dict[str, Any] = {}
    for checkout in checkouts:
        name = "this" if checkout == HERE else checkout.name
        counts = args.workers if supports_workers(checkout) else [1]
        for workers in dict.fromkeys(counts):
            label = f"{name} w={workers}"
            rows = run(label, checkout, workers, args)
            results[label] = [
                {"concurrency": c, "search": vars(s), "write": vars(w)} for c, s, w in rows
            ]
    print(f"load {os.getloadavg()[0]:.2f}", flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
