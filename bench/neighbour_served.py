"""The noisy neighbour against a real `memgate serve`, every party in a process of its own.

    .venv/bin/python -m bench.neighbour_served [--workers 2] [--reads 60] [--burst 2000]
        [--concurrency 16] [--seconds 10] [--offered 100] [--checkout PATH]

bench.noisy_neighbour serves the app in the bench's own event loop, where tenant A's clients,
tenant B's client and the server share one thread: every step of A's requests, refused or not,
queues in front of B's. Here `memgate serve --workers N` runs as a deployment would (its own
embedded PostgreSQL, audit on), set up by the README's steps: the platform admin makes tenants
A and B (`POST /v1/tenants`), each with an agent; A's load runs in a second process and B's
reads (`GET /v1/memories`, one at a time) in this one. A's limit (20 requests/s, burst 20) is
set and removed through `PUT /v1/tenants/{id}/limits`, then the bench waits out the replicas'
limit cache (`MEMGATE_QUOTA_CONFIG_SECONDS`, 1 s here).

Phases as in bench.noisy_neighbour: baseline; A closed-loop (`--concurrency` at once for
`--seconds`, at most `--burst`), limited then unlimited; A open-loop (`--offered` requests a
second on a fixed schedule), limited then unlimited. Prints B's p50/p95/max per phase and A's
answers. Everything stays on loopback and is bounded by `--burst` and `--seconds`.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import multiprocessing
import time
from pathlib import Path
from typing import Any

import httpx

from bench.http_load import HERE, SCOPES, platform_token, served
from bench.noisy_neighbour import NOTE, _burst, _offered, _reads, _summary

LIMITED = {"requests_per_second": 20, "request_burst": 20}
CACHE_SECONDS = 1.0


def _tenant_with_agent(http: httpx.Client, platform: dict[str, str], name: str) -> tuple[str, str]:
    """A tenant made as an operator would, an agent in it: (tenant id, the agent's token)."""
    made = http.post("/v1/tenants", json={"name": name}, headers=platform)
    made.raise_for_status()
    tenant, admin = made.json()["tenant"]["tenant_id"], made.json()["admin"]
    admin_token = http.post(
        "/oauth/token",
        data={"grant_type": "client_credentials"},
        auth=(admin["client_id"], admin["client_secret"]),
    ).json()["access_token"]
    headers = {"Authorization": f"Bearer {admin_token}"}
    user = http.post("/v1/principals", json={"display_name": name}, headers=headers).json()
    client = http.post(
        "/v1/clients",
        json={"principal_id": user["id"], "name": "agent", "scopes": SCOPES.split()},
        headers=headers,
    ).json()
    token = http.post(
        "/oauth/token",
        data={"grant_type": "client_credentials", "scope": SCOPES},
        auth=(client["client"]["client_id"], client["client_secret"]),
    ).json()["access_token"]
    return tenant, token


def _load(
    base: str, token: str, options: dict[str, Any], open_loop: bool, answers: Any, started: Any
) -> None:
    """A's load, in a process of its own (`started` once its imports are done)."""
    headers = {"Authorization": f"Bearer {token}"}
    if open_loop:
        load = _offered(base, headers, options["offered"], options["burst"], options["seconds"])
    else:
        load = _burst(base, headers, options["burst"], options["concurrency"], options["seconds"])
    started.set()
    answers.put(dict(asyncio.run(load)))


async def _b_while(base: str, headers: dict[str, str], reads: int, busy: Any) -> list[float]:
    """B's reads, one at a time, at least `reads` and for as long as A's process runs."""
    done = asyncio.Event()

    async def watch() -> None:
        while busy.is_alive():  # noqa: ASYNC110 (another process: no event to await)
            await asyncio.sleep(0.05)
        done.set()

    watcher = asyncio.create_task(watch())
    async with httpx.AsyncClient(base_url=base, timeout=60) as http:
        samples, statuses = await _reads(http, headers, reads, done)
    await watcher
    bad = {c: n for c, n in statuses.items() if c != 200}
    if bad:
        raise SystemExit(f"B got answers other than 200: {bad}")
    return samples


def run(checkout: Path, workers: int, options: dict[str, Any]) -> None:
    with served(checkout, workers, {"MEMGATE_QUOTA_CONFIG_SECONDS": str(CACHE_SECONDS)}) as server:
        platform = {"Authorization": f"Bearer {platform_token(server)}"}
        with httpx.Client(base_url=server.url, timeout=60) as http:
            tenant_a, token_a = _tenant_with_agent(http, platform, "noisy")
            _, token_b = _tenant_with_agent(http, platform, "quiet")
            quiet = {"Authorization": f"Bearer {token_b}"}
            for token in (token_a, token_b):
                note = http.post(
                    "/v1/memories", json=NOTE, headers={"Authorization": f"Bearer {token}"}
                )
                note.raise_for_status()

            def limit(limits: dict[str, int]) -> None:
                http.put(f"/v1/tenants/{tenant_a}/limits", json=limits, headers=platform)
                time.sleep(CACHE_SECONDS + 1.0)  # every replica reads it again; A's bucket full

            rows: list[tuple[str, str, str]] = []
            asyncio.run(_b_while(server.url, quiet, 10, _Done()))  # warm up
            rows.append(
                (
                    "baseline",
                    _summary(asyncio.run(_b_while(server.url, quiet, options["reads"], _Done())))[
                        2
                    ],
                    "",
                )
            )
            context = multiprocessing.get_context("spawn")
            for name, limited, open_loop in (
                ("A bursts, limited", True, False),
                ("A bursts, unlimited", False, False),
                (f"A offers {options['offered']:g}/s, limited", True, True),
                (f"A offers {options['offered']:g}/s, unlimited", False, True),
            ):
                limit(LIMITED if limited else {})
                answers, started = context.Queue(), context.Event()
                noisy = context.Process(
                    target=_load, args=(server.url, token_a, options, open_loop, answers, started)
                )
                noisy.start()
                started.wait(timeout=120)
                samples = asyncio.run(_b_while(server.url, quiet, options["reads"], noisy))
                codes = answers.get(timeout=options["seconds"] * 4)
                noisy.join()
                counted = " ".join(
                    f"{c}:{n}" for c, n in sorted(collections.Counter(codes).items())
                )
                rows.append((name, _summary(samples)[2], f"A's answers {counted}"))
    print(
        f"memgate serve --workers {workers}; B's reads one at a time; A in its own process: "
        f"{options['concurrency']} at once for {options['seconds']:g} s, then "
        f"{options['offered']:g} requests/s on a fixed schedule (limit 20/s, burst 20)"
    )
    for name, summary, extra in rows:
        print(f"{name:<26} {summary}  {extra}")


class _Done:
    """A load that has already finished (the baseline phase)."""

    @staticmethod
    def is_alive() -> bool:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--reads", type=int, default=60, help="B's reads per phase (at least)")
    parser.add_argument("--burst", type=int, default=2000, help="most requests of A per phase")
    parser.add_argument("--concurrency", type=int, default=16, help="A's requests at once")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of a burst phase")
    parser.add_argument("--offered", type=float, default=100.0, help="A's open-loop rate (/s)")
    parser.add_argument("--checkout", type=Path, default=HERE)
    args = parser.parse_args()
    options = {
        "burst": args.burst,
        "concurrency": args.concurrency,
        "seconds": args.seconds,
        "offered": args.offered,
        "reads": args.reads,
    }
    run(args.checkout.resolve(), args.workers, options)


if __name__ == "__main__":
    main()
