"""The stale-fact scenario (issue 12): do facts stay current when they change?

    .venv/bin/python -m bench.stale_facts

Ten facts are written, then updated two weeks later (`valid_from`): six under the same key,
four under a new key by a writer who did not know the old one. Five look-alike neighbours
("Staging read replica runs on Postgres 14" beside "Staging runs on Postgres 16") sit among
them and must never be replaced. Each fact then has a probe (a question); its top hit must be
the current value.

Played twice through the real API (in process, embedded PostgreSQL or DATABASE_URL, the
default embedder), each time in a fresh tenant:

- **gate on** (the default): a new-key update answers 409 `key-choice-required` listing the
  subject's keys; the agent reuses the key it meant (the one that holds the fact it updates,
  which the scenario labels: the simulated agent reads the offered keys the way a model
  would and picks that one, never `new_key`), so the update supersedes the old value;
- **gate off** (`write_gate: false` on the space): the new-key update is written beside the
  old value, which stays live.

Prints one row per run: probes whose top hit is current, probes whose top hit is stale,
probes whose hits still hold the stale value anywhere (k=5), neighbours alive and unchanged,
and the 409s the agent resolved.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import httpx

from bench.database import bench_database

FORM = {"grant_type": "client_credentials"}


@dataclass(frozen=True)
class Fact:
    subject: str
    key: str
    old: str
    new: str
    probe: str
    new_key: str | None = None
    """The key the updating writer uses when it does not know `key` (None: it knows it)."""


@dataclass(frozen=True)
class Neighbour:
    subject: str
    key: str
    value: str


FACTS = (
    # Updated under the same key: the writer knows it.
    Fact(
        "service:billing",
        "deploy.window",
        "Billing deploys happen on Tuesdays between 10:00 and 12:00 UTC",
        "Billing deploys happen on Thursdays between 14:00 and 16:00 UTC",
        "When do billing deploys happen?",
    ),
    Fact(
        "env:staging",
        "db.version",
        "Staging runs on Postgres 15",
        "Staging runs on Postgres 16",
        "Which Postgres version does staging run on?",
    ),
    Fact(
        "team:payments",
        "oncall.primary",
        "The payments primary on-call engineer is Dana",
        "The payments primary on-call engineer is Priya",
        "Who is the payments primary on-call engineer?",
    ),
    Fact(
        "service:search",
        "owner",
        "The search service is owned by the Discovery team",
        "The search service is owned by the Relevance team",
        "Which team owns the search service?",
    ),
    Fact(
        "service:api",
        "rate.limit",
        "The public API allows 100 requests per minute per key",
        "The public API allows 300 requests per minute per key",
        "What is the public API rate limit per key?",
    ),
    Fact(
        "office:berlin",
        "wifi.network",
        "The Berlin office wifi network is called memgate-guest",
        "The Berlin office wifi network is called memgate-visitors",
        "What is the Berlin office wifi network called?",
    ),
    # Updated under a new key: the writer did not know the old one.
    Fact(
        "service:billing",
        "currency.default",
        "Billing invoices default to the EUR currency",
        "Billing invoices default to the USD currency",
        "Which currency do billing invoices default to?",
        new_key="default.currency",
    ),
    Fact(
        "env:staging",
        "region",
        "Staging is deployed in the AWS region eu-west-1",
        "Staging is deployed in the AWS region eu-central-1",
        "Which AWS region is staging deployed in?",
        new_key="aws.region",
    ),
    Fact(
        "team:payments",
        "standup.time",
        "The payments team standup is at 09:30 Berlin time",
        "The payments team standup is at 10:15 Berlin time",
        "When is the payments team standup?",
        new_key="meeting.standup",
    ),
    Fact(
        "service:api",
        "version.current",
        "The current public API version is v2",
        "The current public API version is v3",
        "What is the current public API version?",
        new_key="api.version",
    ),
)

NEIGHBOURS = (
    Neighbour("env:staging", "replica.db.version", "Staging read replica runs on Postgres 14"),
    Neighbour("env:production", "db.version", "Production runs on Postgres 15"),
    Neighbour("team:payments", "oncall.pager", "The payments on-call pager number is +49 30 1234"),
    Neighbour(
        "service:api", "rate.limit.internal", "The internal API allows 1000 requests per minute"
    ),
    Neighbour(
        "service:api", "version.deprecated", "The deprecated public API version v1 ends in March"
    ),
)


@dataclass(frozen=True)
class Outcome:
    gate: bool
    probes: int
    top_current: int
    top_stale: int
    stale_in_hits: int
    neighbours_alive: int
    conflicts_resolved: int
    """409s the agent answered by reusing the key it meant (gate on only)."""
    misses: tuple[tuple[str, str | None], ...] = ()
    """(probe, top hit's value) of each probe whose top hit is not the current value."""


async def _post(client: httpx.AsyncClient, path: str, headers: dict[str, str], body: Any) -> Any:
    answer = await client.post(path, json=body, headers=headers)
    if answer.status_code >= 300:
        raise RuntimeError(f"{path}: {answer.status_code} {answer.text}")
    return answer.json()


async def play(
    client: httpx.AsyncClient,
    admin: dict[str, str],
    writer: dict[str, str],
    *,
    gate: bool,
    now: datetime | None = None,
) -> Outcome:
    """The scenario in the writer's personal space (the admin turns its gate off when `gate`
    is false). Facts start two weeks before `now` and change at `now`."""
    start = (now or datetime.now(UTC)) - timedelta(days=14)
    changed = start + timedelta(days=14)

    def body(subject: str, key: str, value: str, at: datetime, **extra: Any) -> dict[str, Any]:
        return {
            "subject": subject,
            "kind": "fact",
            "key": key,
            "value": value,
            "valid_from": at.isoformat(),
            "source": "stale-facts",
        } | extra

    # The original writer knows every fact is its own key (several per subject): new_key.
    originals = [body(f.subject, f.key, f.old, start, new_key=True) for f in FACTS]
    neighbours = [body(n.subject, n.key, n.value, start, new_key=True) for n in NEIGHBOURS]
    written = [await _post(client, "/v1/memories", writer, b) for b in originals + neighbours]
    space = written[0]["memory"]["space_id"]
    neighbour_ids = [w["memory"]["id"] for w in written[len(FACTS) :]]
    switch = await client.put(
        f"/v1/spaces/{space}/settings", json={"write_gate": gate}, headers=admin
    )
    if switch.status_code != 200:
        raise RuntimeError(f"settings: {switch.status_code} {switch.text}")

    resolved = 0
    for fact in FACTS:
        update = body(fact.subject, fact.new_key or fact.key, fact.new, changed)
        answer = await client.post("/v1/memories", json=update, headers=writer)
        if answer.status_code == 409:
            offered = {k["key"] for k in answer.json()["keys"]}
            if fact.key not in offered:
                raise RuntimeError(f"the gate did not offer {fact.key}: {sorted(offered)}")
            # The agent reuses the key that holds the fact it updates.
            await _post(client, "/v1/memories", writer, {**update, "key": fact.key})
            resolved += 1
        elif answer.status_code != 201:
            raise RuntimeError(f"update: {answer.status_code} {answer.text}")

    top_current = top_stale = stale_in_hits = 0
    misses: list[tuple[str, str | None]] = []
    for fact in FACTS:
        found = await _post(client, "/v1/memories/search", writer, {"query": fact.probe, "k": 5})
        values = [hit["memory"]["value"] for hit in found["hits"]]
        top = values[0] if values else None
        top_current += top == fact.new
        if top != fact.new:
            misses.append((fact.probe, top))
        top_stale += top == fact.old
        stale_in_hits += fact.old in values

    alive = 0
    for neighbour, memory_id in zip(NEIGHBOURS, neighbour_ids, strict=True):
        got = await client.get(f"/v1/memories/{memory_id}", headers=writer)
        memory = got.json() if got.status_code == 200 else {}
        alive += memory.get("status") == "live" and memory.get("value") == neighbour.value
    return Outcome(
        gate, len(FACTS), top_current, top_stale, stale_in_hits, alive, resolved, tuple(misses)
    )


def table(outcomes: list[Outcome]) -> str:
    rows = [
        "| write gate | probes | top hit current | top hit stale | stale value among hits (k=5) "
        "| neighbours alive | 409s resolved by reusing the key |",
        "|---|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        rows.append(
            f"| {'on' if o.gate else 'off'} | {o.probes} | {o.top_current} | {o.top_stale} "
            f"| {o.stale_in_hits} | {o.neighbours_alive}/{len(NEIGHBOURS)} "
            f"| {o.conflicts_resolved} |"
        )
    return "\n".join(rows)


async def _tenant(client: httpx.AsyncClient, platform: tuple[str, str], name: str) -> Any:
    operator = await client.post("/oauth/token", data=FORM, auth=platform)
    headers = {"Authorization": f"Bearer {operator.json()['access_token']}"}
    return await _post(client, "/v1/tenants", headers, {"name": name})


async def _bearer(client: httpx.AsyncClient, client_id: str, secret: str) -> dict[str, str]:
    token = (await client.post("/oauth/token", data=FORM, auth=(client_id, secret))).json()
    return {"Authorization": f"Bearer {token['access_token']}"}


async def run(url: str) -> list[Outcome]:
    from bench.api import new_runtime
    from service.app import create_app
    from service.identity.service import create_tenant

    runtime = await new_runtime(url)
    outcomes = []
    transport = httpx.ASGITransport(app=cast(Any, create_app(runtime)))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost:8080") as c:
            async with runtime.sessionmaker.begin() as session:
                made = await create_tenant(session, "platform", platform=True)
            platform = (str(made.client_id), made.client_secret)
            for gate in (True, False):
                tenant = await _tenant(c, platform, f"stale-{'on' if gate else 'off'}")
                admin_client = tenant["admin"]
                admin = await _bearer(c, admin_client["client_id"], admin_client["client_secret"])
                user = await _post(c, "/v1/principals", admin, {"display_name": "writer"})
                agent = await _post(
                    c,
                    "/v1/clients",
                    admin,
                    {
                        "principal_id": user["id"],
                        "name": "agent",
                        "scopes": ["read:memory", "write:memory"],
                    },
                )
                writer = await _bearer(c, agent["client"]["client_id"], agent["client_secret"])
                outcomes.append(await play(c, admin, writer, gate=gate))
    finally:
        await runtime.close()
    return outcomes


def main() -> None:
    with bench_database() as url:
        outcomes = asyncio.run(run(url))
    print(table(outcomes))
    for outcome in outcomes:
        for probe, top in outcome.misses:
            print(f"gate {'on' if outcome.gate else 'off'}: {probe!r} -> top hit {top!r}")


if __name__ == "__main__":
    main()
