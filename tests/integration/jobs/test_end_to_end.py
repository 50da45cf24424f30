"""Issue 13 end to end: every job queued through `POST /v1/jobs/{name}/runs` by a `run:jobs`
admin and taken to its end by the real runner as the tenant's job principal (granted by policy
through the API), then checked through what readers see (promise 6: a summary inherits the most
restrictive scope of its inputs) and what the run and the audit chain say.

The jobs' own tests call batch functions directly; these go through the runner's call per
batch, its grant snapshot (enqueue ∩ now), its refusal and its audit rows."""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import replace
from typing import Any

import httpx
from sqlalchemy import text

from service.embeddings import model_tag
from service.jobs.registry import JOBS
from service.jobs.runner import Runner
from tests.fixtures.api import Agent, Api
from tests.integration.cli.test_embedded_lifecycle import Server, server
from tests.integration.jobs.batch_support import RenamedModel
from tests.integration.jobs.consolidation_support import grant, live, summaries, team_space
from tests.integration.jobs.e2e_support import (
    job_subject,
    leak_world,
    mcp_recalls,
    rest_probes,
    run_through_runner,
    summaries_counted,
)
from tests.integration.jobs.support import audit_rows, make_job_principal, queue, run_of
from tests.integration.jobs.world import (
    BRIDGE_FACT,
    MARKERS,
    PLATFORM_FACT,
    PRIVATE,
    SUBJECT,
    TEAM_FACT,
)
from tests.integration.memory.support import as_owner, count_memories

__all__ = ["server"]  # the fixture of a real `memgate serve`, used by name

CONSOLIDATE = "memory.consolidate"
QUERIES = (*PRIVATE.values(), TEAM_FACT, PLATFORM_FACT, BRIDGE_FACT, "search summary")
OWN_PRIVATE = {"alice": ["alice"], "bob": ["bob", "bob-derived"], "carol": ["carol"], "erin": []}


def _ids(*rows: dict[str, Any]) -> list[uuid.UUID]:
    return sorted(uuid.UUID(row["id"]) for row in rows)


def _assert_no_leak(name: str, seen: list[dict[str, Any]]) -> None:
    """No summary carries private text; other rows carry only the member's own."""
    mine = {PRIVATE[n] for n in OWN_PRIVATE[name]}
    for memory in seen:
        value = memory["value"]
        if memory["kind"] == "summary":
            assert not any(m in value for m in MARKERS), (name, value)
        elif any(m in value for m in MARKERS):
            assert value in mine, (name, value)


async def _audited(api: Api, action: str, run_id: uuid.UUID) -> list[tuple[Any, ...]]:
    rows = await audit_rows(api, action, run_id)
    return [(r["status"], r["decision"], r["reason"], r["result_count"]) for r in rows]


async def _chain_verifies(api: Api) -> None:
    """The tenant's audit chain (with the batches' rows in it) still verifies end to end."""
    verified = await api.http.get("/v1/audit/verify", headers=api.admin.headers)
    assert verified.status_code == 200, verified.text
    assert verified.json()["ok"] is True, verified.json()


async def test_the_issues_leak_scenario_through_the_runner(api: Api) -> None:
    world = await leak_world(api, "read", "write", "delete")
    rows = world.rows
    # One scope per batch: each summary is written by its own call, resumed from the cursor.
    run = await run_through_runner(api, CONSOLIDATE, size=1)
    run_id = uuid.UUID(run["id"])

    assert (run["status"], run["batches"]) == ("finished", 3)
    assert run["principal_id"] == job_subject(api).removeprefix("service:")
    assert run["counts"] == {
        "subjects_seen": 3,
        "unchanged": 0,
        "summaries_written": 3,
        "retracted": 0,
        "inputs_excluded": 0,
    }
    written = live(await summaries(api.runtime))
    by_scope = {(r["space_id"], tuple(r["read_requires"])): r for r in written}
    search, platform = uuid.UUID(world.search), uuid.UUID(world.platform)
    # One summary per scope: the search space's own audience, its "also platform" audience
    # (the bridge row), the platform space. Nothing from a personal space, nothing from Bob's
    # team row derived from his private note (the job principal cannot read it).
    assert set(by_scope) == {(search, ()), (search, (platform,)), (platform, ())}
    assert by_scope[(search, ())]["derived_from"] == _ids(rows["team"])
    assert by_scope[(search, (platform,))]["derived_from"] == _ids(rows["bridge"])
    assert by_scope[(platform, ())]["derived_from"] == _ids(rows["platform"])
    for row in written:
        assert (row["subject"], row["key"]) == (SUBJECT, "consolidation")
        assert not any(m in row["value"] for m in MARKERS), row["value"]
    assert TEAM_FACT in by_scope[(search, ())]["value"]
    # Each batch was one audited call of the job's operation as the job principal.
    audited = await _audited(api, CONSOLIDATE, run_id)
    assert len(audited) == run["batches"]
    assert all(status == 200 and decision == "allow" for status, decision, *_ in audited)
    assert sum(count for *_, count in audited) == 3
    await _chain_verifies(api)

    names = {world.search: "search", world.platform: "platform"}
    print(f"\nrun {run['status']} in {run['batches']} batch(es): {run['counts']}")
    for row in written:
        audience = [names[str(s)] for s in row["read_requires"]]
        print(
            f"  summary in {names[str(row['space_id'])]}, read_requires {audience}, "
            f"derived_from {len(row['derived_from'])} input(s)"
        )

    readers = {
        "alice": {by_scope[(search, ())]["id"]},
        "bob": {by_scope[(search, ())]["id"]},
        "carol": {by_scope[(platform, ())]["id"]},
        "erin": {r["id"] for r in written},
    }
    ids = [str(r["id"]) for r in written]
    recalled = await mcp_recalls(api, world.members, QUERIES)
    for name, agent in world.members.items():
        seen = await rest_probes(api, agent, QUERIES, ids)
        _assert_no_leak(name, seen)
        _assert_no_leak(name, recalled[name])
        shown = {uuid.UUID(m["id"]) for m in seen if m["kind"] == "summary"}
        assert shown == readers[name], name
        recalled_summaries = {uuid.UUID(m["id"]) for m in recalled[name] if m["kind"] == "summary"}
        assert recalled_summaries == shown, name
        assert await summaries_counted(api, agent) == len(readers[name]), name
        print(
            f"  probes by {name}: {len(seen)} via REST, {len(recalled[name])} via MCP recall "
            f"({len(recalled_summaries)} summaries), {len(shown)} summaries, none carrying "
            "another's private text"
        )


async def test_a_cross_space_summary_through_the_runner_needs_every_space(api: Api) -> None:
    world = await leak_world(api, "read", "write", "delete")
    policy = {"consolidation": {"with_spaces": [world.platform]}}
    put = await api.http.put(
        f"/v1/spaces/{world.search}/settings", json=policy, headers=api.admin.headers
    )
    assert put.status_code == 200, put.text

    run = await run_through_runner(api, CONSOLIDATE)
    assert run["status"] == "finished"
    assert run["counts"]["summaries_written"] == 4  # three per scope and the cross-space one
    everyone = live(await summaries(api.runtime))
    [across] = [r for r in everyone if r["key"] == "consolidation.across"]
    search, platform = uuid.UUID(world.search), uuid.UUID(world.platform)
    assert (across["space_id"], across["read_requires"]) == (search, [platform])
    rows = world.rows
    assert sorted(across["derived_from"]) == _ids(rows["team"], rows["bridge"], rows["platform"])
    assert not any(m in across["value"] for m in MARKERS)

    ids = [str(r["id"]) for r in everyone]
    for name, agent in world.members.items():
        seen = await rest_probes(api, agent, QUERIES, ids)
        _assert_no_leak(name, seen)
        # Alice and Bob read only the search space, Carol only the platform space.
        assert (across["id"] in {uuid.UUID(m["id"]) for m in seen}) is (name == "erin"), name


async def _one_team(api: Api) -> tuple[Agent, str]:
    alice = await api.new_agent("alice")
    team = await team_space(api, "search", alice)
    await make_job_principal(api)
    await grant(api, team, job_subject(api), "read", "write", "delete")
    # A run started through the API stays inside what its starter reads (docs/jobs.md).
    await grant(api, team, f"user:{api.admin.principal_id}", "read")
    return alice, team


async def _fact(api: Api, agent: Agent, team: str, key: str, value: str, **fields: Any) -> str:
    row = await api.remember(agent, subject=SUBJECT, key=key, value=value, space_id=team, **fields)
    memory_id: str = row["id"]
    return memory_id


async def test_a_deleted_or_expired_input_is_left_out_on_the_next_run(api: Api) -> None:
    alice, team = await _one_team(api)
    window = await _fact(api, alice, team, "window", "Deploys run on Tuesdays")
    pager = await _fact(api, alice, team, "pager", "The pager password is hunter2")
    brief = await _fact(api, alice, team, "freeze", "Code freeze this week", ttl_seconds=2)
    first = await run_through_runner(api, CONSOLIDATE)
    assert (first["status"], first["counts"]["summaries_written"]) == ("finished", 1)
    [before] = live(await summaries(api.runtime))
    assert sorted(before["derived_from"]) == sorted(uuid.UUID(i) for i in (window, pager, brief))

    deleted = await api.http.delete(f"/v1/memories/{pager}", headers=alice.headers)
    assert deleted.status_code == 204, deleted.text
    await asyncio.sleep(2.5)  # the freeze note (and the summary with it) expires
    second = await run_through_runner(api, CONSOLIDATE)
    assert second["status"] == "finished"
    assert (second["counts"]["summaries_written"], second["counts"]["unchanged"]) == (1, 0)
    [after] = live(await summaries(api.runtime))
    assert after["derived_from"] == [uuid.UUID(window)]
    assert "hunter2" not in after["value"]
    assert "freeze" not in after["value"].lower()
    assert after["expires_at"] is None
    assert after["version"] == before["version"] + 1
    got = await api.http.get(f"/v1/memories/{after['id']}", headers=alice.headers)
    assert got.status_code == 200, got.text
    assert "hunter2" not in got.json()["value"]
    found = await api.search(alice, "pager password", k=10, min_score=0, mode="lexical")
    assert all("hunter2" not in h["memory"]["value"] for h in found.json()["hits"])

    third = await run_through_runner(api, CONSOLIDATE)
    assert (third["counts"]["summaries_written"], third["counts"]["unchanged"]) == (0, 1)


async def test_a_job_principal_without_its_grants_is_refused_and_changes_nothing(
    api: Api,
) -> None:
    # Read only: consolidation needs read, write and delete (a summary it writes it must be
    # able to take down when an input is deleted).
    await leak_world(api, "read")
    stored = await count_memories(api.runtime)
    run = await run_through_runner(api, CONSOLIDATE)
    assert run["status"] == "refused"
    assert run["error"]["slug"] == "job-grants-missing"
    assert any(f"'{missing}'" in run["error"]["detail"] for missing in ("write", "delete"))
    assert job_subject(api) in run["error"]["detail"]
    assert (run["counts"], run["batches"]) == ({}, 0)
    assert await count_memories(api.runtime) == stored
    assert await summaries(api.runtime) == []
    assert await _audited(api, CONSOLIDATE, uuid.UUID(run["id"])) == [
        (403, "deny", "job-grants-missing", None)
    ]
    await _chain_verifies(api)


async def test_age_unused_through_the_runner(api: Api) -> None:
    # A team space: a personal space is its owner's alone, no grant reaches it.
    alice, space = await _one_team(api)
    used = await _fact(api, alice, space, "deploy.window", "Deploys happen on Tuesdays")
    unused = await _fact(api, alice, space, "lunch", "The canteen serves soup")
    fresh = await _fact(api, alice, space, "oncall", "Oncall rotates weekly")
    put = await api.http.put(
        f"/v1/spaces/{space}/settings", json={"max_unused_days": 30}, headers=api.admin.headers
    )
    assert put.status_code == 200, put.text
    async with as_owner(api.runtime) as conn:
        await conn.execute(
            text(
                "UPDATE memories SET recorded_at = recorded_at - interval '60 days', "
                "valid_from = valid_from - interval '60 days' WHERE id = ANY(:ids)"
            ),
            {"ids": [uuid.UUID(used), uuid.UUID(unused)]},
        )
        await conn.commit()
    found = await api.search(alice, "when do deploys happen", k=1)
    assert [h["memory"]["id"] for h in found.json()["hits"]] == [used]
    await api.runtime.recalls.flush()

    run = await run_through_runner(api, "memory.age_unused")
    assert (run["status"], run["counts"]) == ("finished", {"examined": 3, "expired": 1})
    listed = await api.http.get("/v1/memories", headers=alice.headers)
    assert {m["id"] for m in listed.json()["items"]} == {used, fresh}
    audited = await _audited(api, "memory.age_unused", uuid.UUID(run["id"]))
    assert [(status, decision) for status, decision, *_ in audited] == [(200, "allow")] * len(
        audited
    )
    assert len(audited) == run["batches"] >= 1
    await _chain_verifies(api)


async def test_reembed_through_the_runner(api: Api) -> None:
    alice, team = await _one_team(api)
    facts = ("Deploys happen on Tuesdays", "The oncall rotates on Mondays", "Lot B is for guests")
    for i, value in enumerate(facts):
        await _fact(api, alice, team, f"k{i}", value)
    renamed = RenamedModel(api.runtime.embedder)
    switched = replace(api.runtime, embedder=renamed)

    run_id = await queue(api, "embeddings.reembed")
    await Runner(switched, JOBS, batch_size=2).run(uuid.UUID(api.tenant_id), run_id)
    run = await run_of(api, run_id)
    assert (run["status"], run["counts"], run["batches"]) == (
        "finished",
        {"stale": 3, "reembedded": 3},
        2,
    )
    async with as_owner(api.runtime) as conn:
        models = {r[0] for r in await conn.execute(text("SELECT embedding_model FROM memories"))}
    assert models == {model_tag(renamed)}
    audited = await _audited(api, "embeddings.reembed", run_id)
    assert [(s, d, c) for s, d, _, c in audited] == [(200, "allow", 2), (200, "allow", 1)]
    await _chain_verifies(api)


def _served(server: Server, method: str, path: str, token: str, **body: Any) -> httpx.Response:
    return httpx.request(
        method,
        f"{server.url}{path}",
        headers={"Authorization": f"Bearer {token}"},
        json=body or None,
        timeout=10,
    )


def _stored_through_api(server: Server, token: str) -> list[dict[str, Any]]:
    listed = _served(server, "GET", "/v1/memories?limit=100", token)
    assert listed.status_code == 200, listed.text
    items: list[dict[str, Any]] = listed.json()["items"]
    return items


def test_a_cli_dry_run_against_a_running_server_counts_and_writes_nothing(
    server: Server,
) -> None:
    server.start()
    token = server.run("token").stdout.strip()
    tenant = json.loads((server.data_dir / "admin-client.json").read_text())["tenant_id"]
    me = _served(server, "GET", "/v1/principals", token).json()["items"][0]["id"]
    space = _served(server, "POST", "/v1/spaces", token, name="search", kind="team")
    space_id = space.json()["space"]["id"]
    # Another job's dry run makes the job principal (to grant it) without queueing the one
    # the CLI will run.
    made = _served(server, "POST", "/v1/jobs/memory.sweep_expired/runs", token, dry_run=True)
    assert made.status_code == 202, made.text
    job = made.json()["principal_id"]
    for subject in (f"user:{me}", f"service:{job}"):
        for action in ("read", "write", "delete"):  # consolidation needs all three
            path = f"/v1/spaces/{space_id}/grants/{action}/{subject}"
            assert _served(server, "PUT", path, token).status_code == 200
    for key, value in (("window", "Deploys run on Tuesdays"), ("owner", "Search owns the index")):
        written = _served(
            server,
            "POST",
            "/v1/memories",
            token,
            subject=SUBJECT,
            kind="fact",
            key=key,
            value=value,
            space_id=space_id,
            new_key=True,
        )
        assert written.status_code == 201, written.text
    before = _stored_through_api(server, token)

    dry = server.run("jobs", "run", CONSOLIDATE, "--tenant", tenant, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    [run] = json.loads(dry.stdout)["runs"]
    print(f"\nmemgate jobs run {CONSOLIDATE} --dry-run: {run['status']} {run['counts']}")
    assert (run["status"], run["dry_run"], run["principal_id"]) == ("finished", True, job)
    assert (run["counts"]["subjects_seen"], run["counts"]["summaries_written"]) == (1, 1)
    assert _stored_through_api(server, token) == before  # nothing written, nothing touched
    shown = _served(server, "GET", f"/v1/jobs/runs/{run['id']}", token).json()
    assert (shown["status"], shown["counts"]) == ("finished", run["counts"])

    # The same command without --dry-run writes the summary it counted.
    real = server.run("jobs", "run", CONSOLIDATE, "--tenant", tenant)
    assert real.returncode == 0, real.stderr
    [done] = json.loads(real.stdout)["runs"]
    assert done["counts"] == run["counts"]
    after = _stored_through_api(server, token)
    assert [m["kind"] for m in after if m not in before] == ["summary"]
    server.assert_serving()
