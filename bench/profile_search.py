"""Where a search's (or a write's) time goes in a real `memgate serve`: a py-spy profile under load.

    .venv/bin/python -m bench.profile_search [--seconds 15] [--concurrency 4] [--top 25]
        [--operation search|write]

Starts `memgate serve --workers 1` (bench.http_load's harness), seeds 500 memories, then drives
searches (or single writes) from a separate process while `py-spy record` samples the worker at
200 Hz. Prints the share of samples (inclusive) of the frames that matter most: each line is
"share, function (file)". Needs `py-spy` (`pip install py-spy`; root, or ptrace allowed)."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
import threading
from collections import Counter
from pathlib import Path

from bench.http_load import HERE, Level, agent_token, run_level, served


def _worker_pid(parent: int) -> int:
    children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    for child in children:
        cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        if b"python" in cmdline:
            return int(child)
    return parent  # one process serves


COMPONENTS = {
    "SQLAlchemy (ORM, async bridge, compile)": ("sqlalchemy/",),
    "psycopg (driver)": ("psycopg/",),
    "call: session, naming, finish (service/calls.py)": ("calls.py",),
    "audit row + group commit (service/audit/)": ("audit/rows.py", "audit/group_commit.py"),
    "authentication (token verify, principal check)": ("auth/middleware.py",),
    "memory search (service, repository, Visible)": ("memory/service.py", "memory/repository"),
    "embedding (WordLlama)": ("wordllama",),
    "Litestar (routing, DI, response)": ("litestar/",),
    "msgspec (decode/encode)": ("msgspec",),
    "OpenTelemetry spans": ("opentelemetry/",),
    "uvicorn + httptools": ("uvicorn/", "httptools"),
}


def _inclusive_shares(raw: Path) -> tuple[int, Counter[str], Counter[str]]:
    """py-spy's raw format: one line per stack, `frame;frame;... count`. Returns the samples,
    the share of each component (a stack counts once per component it passes through) and of
    each of memgate's own frames."""
    total = 0
    components: Counter[str] = Counter()
    own: Counter[str] = Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        for name, needles in COMPONENTS.items():
            if any(needle in frame for frame in frames for needle in needles):
                components[name] += n
        for frame in {f for f in frames if "(service/" in f}:
            own[frame] += n
    return total, components, own


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--operation", choices=("search", "write"), default="search")
    args = parser.parse_args()
    spy = shutil.which("py-spy") or str(Path(HERE) / ".venv" / "bin" / "py-spy")
    raw = Path(tempfile.mkdtemp(prefix="memgate-profile-")) / f"{args.operation}.txt"
    with served(HERE, 1) as server:
        token = agent_token(server)
        run_level(Level(server.port, token, "write", 8, 500, 120.0, seed=0))
        worker = _worker_pid(server.process.pid)
        load = threading.Thread(
            target=run_level,
            args=(
                Level(
                    server.port,
                    token,
                    args.operation,
                    args.concurrency,
                    10**6,
                    args.seconds + 3,
                    1,
                ),
            ),
        )
        load.start()
        subprocess.run(  # noqa: S603 (a fixed tool on our own worker)
            [
                spy, "record", "--pid", str(worker), "--rate", "200",
                "--duration", str(int(args.seconds)), "--format", "raw",
                "--output", str(raw), "--nonblocking",
            ],
            check=True,
            capture_output=True,
        )  # fmt: skip
        load.join()
    total, components, own = _inclusive_shares(raw)
    print(f"{total} samples of the worker ({args.seconds:.0f} s, c={args.concurrency}): {raw}")
    print("inclusive share by component:")
    for name, n in components.most_common():
        print(f"  {100 * n / total:5.1f} %  {name}")
    print(f"memgate's own frames (top {args.top}, inclusive):")
    for frame, n in own.most_common(args.top):
        print(f"  {100 * n / total:5.1f} %  {frame}")


if __name__ == "__main__":
    main()
