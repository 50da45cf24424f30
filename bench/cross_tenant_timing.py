"""Does another tenant's id answer measurably slower or faster than an id that exists nowhere?

    .venv/bin/python -m bench.cross_tenant_timing [--memories 300] [--requests 200] [--seed 7]

Starts its own embedded PostgreSQL (or uses DATABASE_URL), builds the real app and talks to it
in process through an ASGI transport (no sockets: what is measured is memgate, not loopback
jitter). Two tenants, each with `--memories` memories written by one agent. The caller (an agent
of tenant A) then times, on three routes, three kinds of target, interleaved in a shuffled order
within each round so that drift (autovacuum, caches warming) hits every kind alike:

- `foreign`: an id of tenant B's (a memory, or B's team space), a different one each round;
- `random`: a made-up id of the same shape (UUIDv7 with a current timestamp), new each round;
- `own`: an id of the caller's own (a memory it wrote, or its personal space).

Routes: GET /v1/memories/{id}; DELETE /v1/memories/{id} (`own` deletes a memory written for it,
so its time includes a real delete); POST /v1/memories/search with `filters.space_id` (k=10).
`--requests` rounds per route, so 9 times `--requests` timed calls in all. For each route it prints
the median and p95 per kind and the foreign/random ratio of medians with a 95% bootstrap
confidence interval (2000 resamples of each kind). A ratio whose interval holds 1.0 is no gap
worth measuring; `own` shows how large a real difference looks (a found row, a search that
ranks). Every foreign and random answer must be the same 404 (checked on each call).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import httpx

from bench.api import PUBLIC_URL, _settings, bearer
from bench.database import bench_database
from service.app import create_app
from service.db.roles import provision_app_login
from service.embeddings.wordllama import WordLlamaEmbedder
from service.identity.service import create_tenant
from service.observability.logging import configure_logging
from service.runtime import Runtime, build_runtime

FORM = {"grant_type": "client_credentials"}
SCOPES = ["read:memory", "write:memory", "delete:memory"]
KINDS = ("foreign", "random", "own")


def uuid7_like() -> str:
    """A made-up id shaped like the service's ids (UUIDv7, now-ish timestamp), so the random
    target differs from a foreign one only in existing nowhere."""
    millis = int(time.time() * 1000)
    rand = int.from_bytes(os.urandom(10), "big")
    value = (millis << 80) | (0x7 << 76) | ((rand >> 64) & 0xFFF) << 64
    value |= (0b10 << 62) | (rand & ((1 << 62) - 1))
    return str(uuid.UUID(int=value))


async def _tenant(client: httpx.AsyncClient, runtime: Runtime, name: str) -> dict[str, Any]:
    """A tenant, its admin's headers, and an agent with the memory scopes."""
    async with runtime.sessionmaker.begin() as session:
        created = await create_tenant(session, name)
    admin = await bearer(client, (str(created.client_id), created.client_secret))
    principal = await client.post(
        "/v1/principals", json={"display_name": f"{name}-agent", "kind": "agent"}, headers=admin
    )
    registered = await client.post(
        "/v1/clients",
        json={"principal_id": principal.json()["id"], "name": "agent", "scopes": SCOPES},
        headers=admin,
    )
    body = registered.json()
    agent = await bearer(client, (body["client"]["client_id"], body["client_secret"]))
    space = await client.post("/v1/spaces", json={"name": f"{name}-space"}, headers=admin)
    return {
        "admin": admin,
        "agent": agent,
        "principal": principal.json(),
        "space": space.json()["space"]["id"],
    }


async def _write(client: httpx.AsyncClient, headers: dict[str, str], i: int, tag: str) -> str:
    response = await client.post(
        "/v1/memories",
        json={
            "subject": f"service:{tag}.{i}",  # distinct facts: the write gate lets each in
            "kind": "fact",
            "key": f"{tag}.note.{i}",
            "value": f"Note {i} of {tag} about who owns the deploy process",
        },
        headers=headers,
    )
    assert response.status_code == 201, response.text
    memory_id: str = response.json()["memory"]["id"]
    return memory_id


def _ratio_ci(
    foreign: list[float], made_up: list[float], rng: random.Random, resamples: int = 2000
) -> tuple[float, float, float]:
    ratio = statistics.median(foreign) / statistics.median(made_up)
    draws = sorted(
        statistics.median(rng.choices(foreign, k=len(foreign)))
        / statistics.median(rng.choices(made_up, k=len(made_up)))
        for _ in range(resamples)
    )
    return ratio, draws[int(0.025 * resamples)], draws[int(0.975 * resamples) - 1]


def _report(route: str, samples: dict[str, list[float]], rng: random.Random) -> None:
    print(route)
    for kind in KINDS:
        values = samples[kind]
        p95 = statistics.quantiles(values, n=20)[18]
        print(
            f"  {kind:<8} p50 {statistics.median(values):7.2f} ms  p95 {p95:7.2f} ms"
            f"  (n={len(values)})"
        )
    ratio, low, high = _ratio_ci(samples["foreign"], samples["random"], rng)
    verdict = "no measurable gap" if low <= 1.0 <= high else "GAP"
    print(f"  foreign/random median ratio {ratio:.3f}  95% CI [{low:.3f}, {high:.3f}]  {verdict}")


Send = Callable[[str], Any]


async def _timed_round(
    sends: dict[str, tuple[Send, str]], samples: dict[str, list[float]], rng: random.Random
) -> None:
    order = list(KINDS)
    rng.shuffle(order)
    for kind in order:
        send, expect = sends[kind]
        started = time.perf_counter()
        response: httpx.Response = await send(kind)
        samples[kind].append((time.perf_counter() - started) * 1000)
        if kind != "own":
            assert response.status_code == 404, response.text
            assert expect in response.text, response.text


async def run(url: str, memories: int, requests: int, seed: int) -> None:
    rng = random.Random(seed)
    # Logged in as the app role (not the owner), so row-level security is on the measured path.
    runtime = await build_runtime(
        _settings(url, Path(tempfile.mkdtemp())),
        provision_app_login(url, "memgate_app"),
        WordLlamaEmbedder(),
        owner_url=url,
    )
    app = create_app(runtime)
    transport = httpx.ASGITransport(app=cast(Any, app))
    async with httpx.AsyncClient(transport=transport, base_url=PUBLIC_URL) as client:
        home = await _tenant(client, runtime, "home")
        away = await _tenant(client, runtime, "away")
        own_ids = [await _write(client, home["agent"], i, "home") for i in range(memories)]
        foreign_ids = [await _write(client, away["agent"], i, "away") for i in range(memories)]
        doomed = [await _write(client, home["agent"], i, "doomed") for i in range(requests)]
        personal = home["principal"]["personal_space_id"]
        print(f"{memories} memories per tenant, {requests} interleaved rounds per route\n")

        for method in ("GET", "DELETE"):
            samples: dict[str, list[float]] = {kind: [] for kind in KINDS}
            for i in range(requests):
                targets = {
                    "foreign": foreign_ids[i % memories],
                    "random": uuid7_like(),
                    "own": own_ids[i % memories] if method == "GET" else doomed[i],
                }

                def send(kind: str, method: str = method, targets: dict[str, str] = targets) -> Any:
                    return client.request(
                        method, f"/v1/memories/{targets[kind]}", headers=home["agent"]
                    )

                await _timed_round(dict.fromkeys(KINDS, (send, "memory-not-found")), samples, rng)
            _report(f"{method} /v1/memories/{{id}}", samples, rng)

        samples = {kind: [] for kind in KINDS}
        for i in range(requests):
            spaces = {"foreign": away["space"], "random": uuid7_like(), "own": personal}

            def search(kind: str, spaces: dict[str, str] = spaces, i: int = i) -> Any:
                return client.post(
                    "/v1/memories/search",
                    json={
                        "query": f"who owns process {i}",
                        "k": 10,
                        "filters": {"space_id": spaces[kind]},
                    },
                    headers=home["agent"],
                )

            await _timed_round(dict.fromkeys(KINDS, (search, "space-not-found")), samples, rng)
        _report("POST /v1/memories/search (filters.space_id)", samples, rng)
    await runtime.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--memories", type=int, default=300)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    # The access log line per call would drown the report (and cost the same for every kind).
    configure_logging(json_logs=False, level=logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    with bench_database() as url:
        asyncio.run(run(url, args.memories, args.requests, args.seed))


if __name__ == "__main__":
    main()
