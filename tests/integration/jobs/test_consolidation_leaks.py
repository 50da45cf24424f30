"""The leak the issue starts from, with real data: after consolidation no probe by any team
member (search in every mode, get, list, history, counts) returns a summary carrying someone
else's private text, and a cross-space summary is invisible to a reader of only one of its
spaces (promise 6)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import text

from service.consolidation.jobs import CONSOLIDATION
from tests.fixtures.api import Agent, Api
from tests.integration.jobs.consolidation_support import live, run_job, summaries
from tests.integration.jobs.world import (
    BRIDGE_FACT,
    MARKERS,
    PLATFORM_FACT,
    PRIVATE,
    SUBJECT,
    TEAM_FACT,
    World,
    build,
)
from tests.integration.memory.support import assert_problem

QUERIES = (*PRIVATE.values(), TEAM_FACT, PLATFORM_FACT, BRIDGE_FACT, "search summary")
MODES = ("hybrid", "vector", "lexical")


def _ids(*rows: dict[str, Any]) -> list[uuid.UUID]:
    return sorted(uuid.UUID(row["id"]) for row in rows)


async def _everything_seen(
    world: World, agent: Agent, summary_ids: list[str]
) -> list[dict[str, Any]]:
    """Every memory one member's probes return: searches in every mode (floor off), the list,
    a get and a history of every summary id (hidden ones answer 404), and the counts."""
    http, seen = world.api.http, []
    for mode in MODES:
        for query in QUERIES:
            found = await world.api.search(agent, query, k=100, min_score=0, mode=mode)
            assert found.status_code == 200, found.text
            seen += [hit["memory"] for hit in found.json()["hits"]]
    listed = await http.get("/v1/memories", params={"limit": 100}, headers=agent.headers)
    assert listed.status_code == 200, listed.text
    seen += listed.json()["items"]
    for memory_id in summary_ids:
        got = await http.get(f"/v1/memories/{memory_id}", headers=agent.headers)
        history = await http.get(f"/v1/memories/{memory_id}/history", headers=agent.headers)
        if got.status_code == 200:
            seen.append(got.json())
            assert history.status_code == 200, history.text
            seen += history.json()["items"]
        else:
            assert_problem(got, 404, "memory-not-found")
            assert_problem(history, 404, "memory-not-found")
    return seen


async def _summaries_counted(world: World, agent: Agent) -> int:
    counted = await world.api.http.get(
        "/v1/memories/counts", params={"group_by": "kind"}, headers=agent.headers
    )
    assert counted.status_code == 200, counted.text
    groups = {g["value"]: g["count"] for g in counted.json()["groups"]}
    return int(groups.get("summary", 0))


def _own_private(world: World, name: str) -> set[str]:
    own = {"alice": ["alice"], "bob": ["bob", "bob-derived"], "carol": ["carol"], "erin": []}
    return {PRIVATE[n] for n in own[name]}


def _assert_no_leak(world: World, name: str, seen: list[dict[str, Any]]) -> None:
    mine = _own_private(world, name)
    for memory in seen:
        value = memory["value"]
        if memory["kind"] == "summary":
            assert not any(m in value for m in MARKERS), (name, value)
        elif any(m in value for m in MARKERS):
            assert value in mine, (name, value)


async def test_no_member_ever_reads_someone_elses_private_text_in_a_summary(api: Api) -> None:
    world = await build(api)
    run = await run_job(api.runtime, CONSOLIDATION, world.job)
    rows = world.rows

    written = live(await summaries(api.runtime))
    by_scope = {(r["space_id"], tuple(r["read_requires"])): r for r in written}
    search, platform = uuid.UUID(world.search), uuid.UUID(world.platform)
    # Per scope: the search space's own audience, the search space's "also platform" audience
    # (the bridge row), the platform space. Nothing from a personal space, nothing from Bob's
    # team row derived from his private note (the job cannot read it).
    assert set(by_scope) == {(search, ()), (search, (platform,)), (platform, ())}
    assert by_scope[(search, ())]["derived_from"] == _ids(rows["team"])
    assert by_scope[(search, (platform,))]["derived_from"] == _ids(rows["bridge"])
    assert by_scope[(platform, ())]["derived_from"] == _ids(rows["platform"])
    for row in written:
        assert (row["subject"], row["key"]) == (SUBJECT, "consolidation")
        assert not any(m in row["value"] for m in MARKERS), row["value"]
    assert TEAM_FACT in by_scope[(search, ())]["value"]
    assert (run.counts["subjects_seen"], run.counts["summaries_written"]) == (3, 3)

    ids = [str(r["id"]) for r in written]
    readers = {
        "alice": {by_scope[(search, ())]["id"]},
        "bob": {by_scope[(search, ())]["id"]},
        "carol": {by_scope[(platform, ())]["id"]},
        "erin": {r["id"] for r in written},
    }
    names = {world.search: "search", world.platform: "platform"}
    print(f"\nconsolidation run: {dict(run.counts)}")  # the closing note's output (-s)
    for row in written:
        audience = [names[str(s)] for s in row["read_requires"]]
        print(
            f"  summary in {names[str(row['space_id'])]}, read_requires {audience}, "
            f"{len(row['derived_from'])} input(s)"
        )
    for name, agent in world.members.items():
        seen = await _everything_seen(world, agent, ids)
        _assert_no_leak(world, name, seen)
        summaries_seen = {uuid.UUID(m["id"]) for m in seen if m["kind"] == "summary"}
        assert summaries_seen == readers[name], name
        assert await _summaries_counted(world, agent) == len(readers[name]), name
        print(
            f"  probes by {name}: {len(seen)} memories returned, {len(summaries_seen)} "
            "summaries, none carrying another's private text"
        )


async def test_a_cross_space_summary_is_only_for_readers_of_every_space(api: Api) -> None:
    world = await build(api)
    policy = {"consolidation": {"with_spaces": [world.platform]}}
    put = await api.http.put(
        f"/v1/spaces/{world.search}/settings", json=policy, headers=api.admin.headers
    )
    assert put.status_code == 200, put.text
    assert put.json()["settings"]["consolidation"]["with_spaces"] == [world.platform]

    await run_job(api.runtime, CONSOLIDATION, world.job)
    [across] = [r for r in live(await summaries(api.runtime)) if r["key"] == "consolidation.across"]
    search, platform = uuid.UUID(world.search), uuid.UUID(world.platform)
    assert across["space_id"] == search
    assert across["read_requires"] == [platform]  # the union of its inputs' spaces and audiences
    rows = world.rows
    assert sorted(across["derived_from"]) == _ids(rows["team"], rows["bridge"], rows["platform"])
    assert not any(m in across["value"] for m in MARKERS)

    everyone = [str(r["id"]) for r in live(await summaries(api.runtime))]
    for name, agent in world.members.items():
        seen = await _everything_seen(world, agent, everyone)
        _assert_no_leak(world, name, seen)
        shown = {uuid.UUID(m["id"]) for m in seen}
        # Alice and Bob read only the search space, Carol only the platform space.
        assert (across["id"] in shown) is (name == "erin"), name


_NAME = (
    "SELECT set_config('memgate.tenant_id', :tenant, true), "
    "set_config('memgate.principal_id', :principal, true)"
)


@pytest.mark.bypasses_visible("row-level security alone, without Visible, over the summaries")
async def test_row_level_security_alone_shows_the_summaries_to_the_same_readers(api: Api) -> None:
    """Backing Visible up: as the app role with no predicate of ours, each member named in the
    transaction sees exactly the summaries the API showed it."""
    world = await build(api)
    policy = {"consolidation": {"with_spaces": [world.platform]}}
    put = await api.http.put(
        f"/v1/spaces/{world.search}/settings", json=policy, headers=api.admin.headers
    )
    assert put.status_code == 200, put.text
    await run_job(api.runtime, CONSOLIDATION, world.job)
    written = live(await summaries(api.runtime))
    assert len(written) == 4
    for name, agent in world.members.items():
        async with api.runtime.engine.begin() as conn:
            await conn.execute(
                text(_NAME), {"tenant": api.tenant_id, "principal": agent.principal_id}
            )
            rows = await conn.execute(
                text(
                    "SELECT id, value FROM memories WHERE kind = 'summary' "
                    "AND superseded_at IS NULL AND retracted_at IS NULL"
                )
            )
            seen = {row.id: row.value for row in rows}
        listed = await api.http.get(
            "/v1/memories", params={"kind": "summary", "limit": 100}, headers=agent.headers
        )
        assert {uuid.UUID(m["id"]) for m in listed.json()["items"]} == set(seen), name
        assert not any(m in value for value in seen.values() for m in MARKERS), name


async def test_another_tenants_space_is_no_partner_and_feeds_nothing(api: Api) -> None:
    """The tenant comes from the job principal, never from the policy: another tenant's space
    cannot be named as a partner (404, as a missing one), and its memories of the same subject
    stay its own."""
    world = await build(api)
    other = await api.other_tenant()
    globex = await other.new_agent("globex-dev")
    admin = other.admin.headers
    created = await other.http.post("/v1/spaces", json={"name": "search"}, headers=admin)
    foreign = created.json()["space"]["id"]
    team = (await other.http.post("/v1/teams", json={"name": "t"}, headers=admin)).json()
    for action in ("read", "write"):
        await other.http.put(
            f"/v1/spaces/{foreign}/grants/{action}/{team['subject']}", headers=admin
        )
    await other.http.put(f"/v1/teams/{team['id']}/members/{globex.principal_id}", headers=admin)
    await other.remember(
        globex, subject=SUBJECT, key="ownership", value="GLOBEX secret roadmap", space_id=foreign
    )
    policy = {"consolidation": {"with_spaces": [foreign]}}
    path = f"/v1/spaces/{world.search}/settings"
    refused = await api.http.put(path, json=policy, headers=api.admin.headers)
    assert_problem(refused, 404, "space-unknown")  # like a space that does not exist
    listed = await api.http.get("/v1/spaces", headers=api.admin.headers)
    [search] = [s for s in listed.json()["items"] if s["id"] == world.search]
    assert search["settings"]["consolidation"]["with_spaces"] == []  # nothing changed

    run = await run_job(api.runtime, CONSOLIDATION, world.job)
    assert run.counts["summaries_written"] == 3  # the per-scope ones; no cross-space summary
    for row in await summaries(api.runtime):
        assert "GLOBEX" not in row["value"]
        assert str(row["space_id"]) != foreign
        assert foreign not in {str(s) for s in row["read_requires"]}
