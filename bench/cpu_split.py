"""Where a search's (or a write's) CPU goes: the server's processes vs PostgreSQL's, per checkout.

    .venv/bin/python -m bench.cpu_split [--checkout PATH ...] [--memories 1000]
        [--searches 200] [--rounds 2] [--operation search|write]

For each checkout (default: this one), round after round (so a busy machine weighs on each
alike), it starts `memgate serve` on a fresh embedded PostgreSQL (bench/http_load.py `served`),
writes `--memories` memories, warms up with 50 requests, then runs `--searches` searches (or
single writes, with `--operation write`) from one client (k=10, the load generator's varied
queries) and reads the CPU time (user + system, from /proc) the server's process tree and the
postmaster's tree spent meanwhile. It prints ms of CPU per request for each, their sum, and the
median over the rounds with the ratio to the first checkout. One client keeps the two apart:
nothing else runs in either tree."""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from bench.http_load import HERE, Level, agent_token, run_level, served, tree_cpu

WARM_UP = 50


def split(checkout: Path, memories: int, searches: int, operation: str) -> tuple[float, float]:
    """(server ms, PostgreSQL ms) of CPU per request of `operation`."""
    with served(checkout, 1) as server:
        token = agent_token(server)
        run_level(Level(server.port, token, "write", 16, memories, 180.0, 0))
        run_level(Level(server.port, token, operation, 1, WARM_UP, 60.0, 9))
        serve, postmaster = server.roots()
        before = tree_cpu([serve]), tree_cpu([postmaster])
        run_level(Level(server.port, token, operation, 1, searches, 120.0, 1))
        after = tree_cpu([serve]), tree_cpu([postmaster])
    return (
        1000 * (after[0] - before[0]) / searches,
        1000 * (after[1] - before[1]) / searches,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkout", type=Path, action="append")
    parser.add_argument("--memories", type=int, default=1000)
    parser.add_argument("--searches", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--operation", choices=("search", "write"), default="search")
    args = parser.parse_args()
    checkouts: list[Path] = args.checkout or [HERE]
    seen: dict[Path, list[tuple[float, float]]] = {c: [] for c in checkouts}
    print(f"{'checkout':<40} {'round':>5} | {'server':>8} {'postgres':>8} {'total':>8}  ms CPU")
    for round_number in range(1, args.rounds + 1):
        for checkout in checkouts:
            server_ms, postgres_ms = split(checkout, args.memories, args.searches, args.operation)
            seen[checkout].append((server_ms, postgres_ms))
            total = server_ms + postgres_ms
            print(
                f"{checkout!s:<40} {round_number:>5} | "
                f"{server_ms:8.1f} {postgres_ms:8.1f} {total:8.1f}",
                flush=True,
            )
    first = statistics.median(s + p for s, p in seen[checkouts[0]])
    print("medians:")
    for checkout, rows in seen.items():
        server_ms = statistics.median(s for s, _ in rows)
        postgres_ms = statistics.median(p for _, p in rows)
        total = statistics.median(s + p for s, p in rows)
        print(
            f"{checkout!s:<40} {'':>5} | {server_ms:8.1f} {postgres_ms:8.1f} {total:8.1f}"
            f"  x{total / first:.2f} of the first"
        )


if __name__ == "__main__":
    main()
