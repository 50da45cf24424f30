"""The leak suite: a tenant with two teams, team facts and private notes that share subjects and
keys, a team summary derived from a private note, and a second tenant with the same subjects.
Every memory carries its own canary. For every read surface (search, get, list with filters,
history walks along `supersedes`, counts, error bodies, policy-read endpoints, logs, audit rows)
and for row-level security alone, no principal ever receives a canary it may not read, nor a
count that includes one. Delegated tokens (search, list, get, counts, RLS) are covered by
test_token_exchange.py."""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy import text

from tests.fixtures.api import Agent, Api
from tests.fixtures.canaries import captured_logs
from tests.fixtures.entrance import bypasses_visible
from tests.integration.audit.support import audit_rows
from tests.integration.memory.support import as_owner, assert_problem

SUBJECT, KEY = "service:billing", "deploy.window"


def unique_word(canary: str) -> str:
    """A word only this canary's memory holds (one lexeme under any configuration), so that a
    lexical search for it can only find that memory."""
    return "zq" + hashlib.sha256(canary.encode()).hexdigest()[:10]


@dataclass
class World:
    agents: dict[str, Agent]
    apis: dict[str, Api]
    memories: dict[str, dict[str, Any]] = field(default_factory=dict)
    """canary → the memory as written"""
    readers: dict[str, set[str]] = field(default_factory=dict)
    """canary → the agents that may read it"""


async def _admin(api: Api, method: str, path: str, **kwargs: Any) -> Any:
    response = await api.http.request(method, path, headers=api.admin.headers, **kwargs)
    assert response.status_code < 300, response.text
    return response.json()


async def _build(api: Api) -> World:
    other = await api.other_tenant()
    names = ("alice", "bob", "dave", "eve")
    agents = {name: await api.new_agent(name) for name in names}
    agents["carol"] = await other.new_agent("carol")
    world = World(agents, {**dict.fromkeys(names, api), "carol": other})
    teams = {}
    for team_name, members in (("billing", ("alice", "bob")), ("infra", ("dave",))):
        team = await _admin(api, "POST", "/v1/teams", json={"name": team_name})
        space = (await _admin(api, "POST", "/v1/spaces", json={"name": team_name}))["space"]
        for action in ("read", "write"):
            await _admin(api, "PUT", f"/v1/spaces/{space['id']}/grants/{action}/{team['subject']}")
        for member in members:
            await _admin(
                api, "PUT", f"/v1/teams/{team['id']}/members/{agents[member].principal_id}"
            )
        teams[team_name] = (team, space, set(members))

    async def write(who: str, canary: str, readers: set[str], **fields: Any) -> dict[str, Any]:
        value = f"{canary} the deploy window note of {who} {unique_word(canary)}"
        memory = await world.apis[who].remember(
            agents[who], subject=SUBJECT, key=KEY, value=value, **fields
        )
        world.memories[canary] = memory
        world.readers[canary] = readers
        return memory

    for team_name, (_, space, team_members) in teams.items():
        await write(
            sorted(team_members)[0],
            f"canary-team-{team_name}",
            set(team_members),
            space_id=space["id"],
        )
    for who in names:
        await write(who, f"canary-private-{who}", {who})
    await write("carol", "canary-tenant-carol", {"carol"})
    billing_space = teams["billing"][1]
    private_alice = world.memories["canary-private-alice"]
    await world.apis["alice"].remember(
        agents["alice"],
        subject=SUBJECT,
        key="deploy.summary",
        value="canary-derived-summary from alice's private note "
        + unique_word("canary-derived-summary"),
        space_id=billing_space["id"],
        derived_from=[private_alice["id"]],
    )
    world.memories["canary-derived-summary"] = {}
    world.readers["canary-derived-summary"] = {"alice"}
    world.agents = agents
    return world


def _leaks(text_seen: str, who: str, world: World) -> list[str]:
    return [
        canary
        for canary, readers in world.readers.items()
        if who not in readers and canary in text_seen
    ]


async def test_no_principal_ever_receives_a_canary_it_may_not_read(
    api: Api, span_exporter: InMemorySpanExporter
) -> None:
    world = await _build(api)
    ids = {canary: m["id"] for canary, m in world.memories.items() if m}
    span_exporter.clear()
    with captured_logs() as events:
        for who, agent in world.agents.items():
            http = world.apis[who].http
            seen: list[str] = []
            for mode in ("hybrid", "vector", "lexical"):
                found = await world.apis[who].search(
                    agent, "deploy window note", k=100, mode=mode, min_score=0
                )
                assert found.status_code == 200, found.text
                seen.append(found.text)
            for params in (
                {},
                {"subject": SUBJECT},
                {"key": KEY},
                {"subject": SUBJECT, "key": KEY},
            ):
                listed = await http.get("/v1/memories", params=params, headers=agent.headers)
                seen.append(listed.text)
            readable = {c for c, readers in world.readers.items() if who in readers}
            for group_by in ("kind", "space", "subject"):
                counted = await http.get(
                    "/v1/memories/counts", params={"group_by": group_by}, headers=agent.headers
                )
                seen.append(counted.text)
                assert counted.json()["total"] == len(readable), (who, group_by)
                assert sum(g["count"] for g in counted.json()["groups"]) == len(readable)
            random_id = str(uuid.uuid4())
            baseline = await http.get(f"/v1/memories/{random_id}", headers=agent.headers)
            for canary, memory_id in ids.items():
                got = await http.get(f"/v1/memories/{memory_id}", headers=agent.headers)
                seen.append(got.text)
                if who in world.readers[canary]:
                    assert got.status_code == 200, (who, canary)
                else:
                    assert_problem(got, 404, "memory-not-found")
                    assert got.content.replace(memory_id.encode(), b"{id}") == (
                        baseline.content.replace(random_id.encode(), b"{id}")
                    )
            for path in (f"/v1/principals/{agent.principal_id}/permissions",):
                seen.append((await http.get(path, headers=world.apis[who].admin.headers)).text)
            everything = "\n".join(seen)
            assert _leaks(everything, who, world) == [], who
            assert readable <= {c for c in world.readers if c in everything}, who
    spans = [span.to_json() for span in span_exporter.get_finished_spans()]
    assert len(spans) > 100, "the reads produced (almost) no spans"
    for canary in world.readers:
        assert canary not in repr(events), "a canary reached the logs"
        assert not [span for span in spans if canary in span], "a canary reached a span"


async def test_a_lexical_search_for_a_canary_word_finds_it_only_for_its_readers(
    api: Api,
) -> None:
    """The lexical leg reads postings under the same Visible: another principal's or another
    tenant's unique word answers nothing at all (floor off, every mode), and its own readers
    get exactly that memory."""
    world = await _build(api)
    for who, agent in world.agents.items():
        for canary, readers in world.readers.items():
            word = unique_word(canary)
            for mode in ("lexical", "hybrid"):
                found = await world.apis[who].search(agent, word, k=100, mode=mode, min_score=0)
                assert found.status_code == 200, found.text
                hits = found.json()["hits"]
                assert _leaks(found.text, who, world) == [], (who, canary, mode)
                holding = [h for h in hits if word in h["memory"]["value"]]
                assert len(holding) == (1 if who in readers else 0), (who, canary, mode)
                if mode == "lexical":
                    assert hits == holding, (who, canary)  # nothing else holds the word


async def test_rls_alone_agrees_with_the_leak_table(api: Api) -> None:
    world = await _build(api)
    for who, agent in world.agents.items():
        tenant = world.apis[who].tenant_id
        with bypasses_visible("row-level security alone, without Visible"):
            async with api.runtime.engine.begin() as conn:
                await conn.execute(
                    text(
                        "SELECT set_config('memgate.tenant_id', :t, true), "
                        "set_config('memgate.principal_id', :p, true)"
                    ),
                    {"t": tenant, "p": agent.principal_id},
                )
                values = (await conn.execute(text("SELECT value FROM memories"))).scalars().all()
        joined = "\n".join(values)
        assert _leaks(joined, who, world) == [], who
        assert {c for c, r in world.readers.items() if who in r} <= {
            c for c in world.readers if c in joined
        }


async def test_a_private_note_never_supersedes_a_team_fact(api: Api) -> None:
    world = await _build(api)
    team_fact = world.memories["canary-team-billing"]
    alice_note = world.memories["canary-private-alice"]
    assert (team_fact["subject"], team_fact["key"]) == (alice_note["subject"], alice_note["key"])
    async with as_owner(api.runtime) as conn:
        live = (
            (
                await conn.execute(
                    text("SELECT id FROM memories WHERE superseded_at IS NULL AND key = :k"),
                    {"k": KEY},
                )
            )
            .scalars()
            .all()
        )
    assert {str(i) for i in live} >= {team_fact["id"], alice_note["id"]}
    assert team_fact["version"] == 1


async def test_removal_from_a_team_takes_effect_on_the_next_request(api: Api) -> None:
    world = await _build(api)
    bob = world.agents["bob"]
    fact = world.memories["canary-team-billing"]
    assert (
        await api.http.get(f"/v1/memories/{fact['id']}", headers=bob.headers)
    ).status_code == 200
    teams = await _admin(api, "GET", "/v1/teams")
    billing = next(team for team in teams["items"] if team["name"] == "billing")
    await _admin(api, "DELETE", f"/v1/teams/{billing['id']}/members/{bob.principal_id}")
    gone = await api.http.get(f"/v1/memories/{fact['id']}", headers=bob.headers)
    assert_problem(gone, 404, "memory-not-found")
    found = await api.search(bob, "deploy window note", k=100)
    assert "canary-team-billing" not in found.text


async def test_canaries_never_reach_the_audit_log(api: Api) -> None:
    world = await _build(api)
    for agent_name, agent in world.agents.items():
        await world.apis[agent_name].search(agent, "canary-private-alice deploy", k=5)
    rendered = repr(await audit_rows_of(api))
    for canary in world.readers:
        assert canary not in rendered


async def audit_rows_of(api: Api) -> list[dict[str, Any]]:
    from service.db.session import create_engine

    engine = create_engine(api.runtime.settings.database.url, pool_size=1)
    try:
        return await audit_rows(engine)
    finally:
        await engine.dispose()


async def test_a_history_walk_never_steps_onto_a_version_it_may_not_read(api: Api) -> None:
    """Versions of one key share space and audience, so a walk along `supersedes` either
    continues on readable versions or stops with the same 404 a random id gets."""
    world = await _build(api)
    bob = world.agents["bob"]
    fact = world.memories["canary-team-billing"]
    newer = await api.remember(
        bob, subject=SUBJECT, key=KEY, value="canary-team-billing-v2", space_id=fact["space_id"]
    )
    world.readers["canary-team-billing-v2"] = {"alice", "bob"}
    assert newer["supersedes"] == fact["id"]
    for name in ("alice", "bob", "dave"):
        walker = world.agents[name]
        current: str | None = newer["id"]
        seen: list[str] = []
        while current is not None:
            got = await api.http.get(f"/v1/memories/{current}", headers=walker.headers)
            if got.status_code == 404:
                random_id = str(uuid.uuid4())
                baseline = await api.http.get(f"/v1/memories/{random_id}", headers=walker.headers)
                assert got.content.replace(current.encode(), b"{id}") == (
                    baseline.content.replace(random_id.encode(), b"{id}")
                )
                break
            assert got.status_code == 200, got.text
            seen.append(got.text)
            current = got.json()["supersedes"]
        assert _leaks("\n".join(seen), name, world) == []
        expected_hops = 2 if name in {"alice", "bob"} else 0
        assert len(seen) == expected_hops
