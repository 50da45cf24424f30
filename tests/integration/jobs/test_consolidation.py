"""memory.consolidate re-derives, never re-writes: nothing changed → nothing written; an
input deleted, superseded or expired → a new summary without it supersedes the old one; no
input left → the summary is retracted. Dry runs, the per-space source policy, batches that
resume, and job principals without grants."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from service.consolidation.jobs import CONSOLIDATION
from service.consolidation.service import Consolidation
from service.consolidation.summarizers import Extractive, Input
from service.jobs.declare import Batch, BatchDone
from tests.fixtures.api import Agent, Api
from tests.integration.jobs.consolidation_support import (
    JobPrincipal,
    grant,
    job_principal,
    live,
    run_job,
    service_subject,
    summaries,
    team_space,
)
from tests.integration.memory.support import count_memories

SUBJECT = "service:search"


async def _team(api: Api, *actions: str) -> tuple[Agent, str, JobPrincipal]:
    alice = await api.new_agent("alice")
    team = await team_space(api, "search", alice)
    job = await job_principal(api)
    if actions:
        await grant(api, team, service_subject(job), *actions)
    return alice, team, job


async def _fact(api: Api, agent: Agent, team: str, key: str, value: str, **fields: Any) -> str:
    body = {"subject": SUBJECT, "key": key, "value": value, "space_id": team} | fields
    row = await api.remember(agent, **body)
    memory_id: str = row["id"]
    return memory_id


def _ids(*ids: str) -> list[uuid.UUID]:
    return sorted(uuid.UUID(i) for i in ids)


async def _delete(api: Api, agent: Agent, memory_id: str) -> None:
    deleted = await api.http.delete(f"/v1/memories/{memory_id}", headers=agent.headers)
    assert deleted.status_code == 204, deleted.text


async def _the_summary(api: Api) -> dict[str, Any]:
    [summary] = live(await summaries(api.runtime))
    return summary


async def test_nothing_changed_nothing_written(api: Api) -> None:
    alice, team, job = await _team(api, "read", "write", "delete")
    await _fact(api, alice, team, "window", "Deploys run on Tuesdays")
    await _fact(api, alice, team, "owner", "The search team owns the index")
    first = await run_job(api.runtime, CONSOLIDATION, job)
    assert first.counts["summaries_written"] == 1
    stored, rows = await count_memories(api.runtime), await summaries(api.runtime)

    again = await run_job(api.runtime, CONSOLIDATION, job)
    assert again.counts["subjects_seen"] == 1
    assert again.counts["unchanged"] == 1
    assert again.counts["summaries_written"] == 0
    assert await count_memories(api.runtime) == stored
    assert await summaries(api.runtime) == rows  # not even a version bump


async def test_a_deleted_input_is_left_out_of_the_next_summary(api: Api) -> None:
    alice, team, job = await _team(api, "read", "write", "delete")
    window = await _fact(api, alice, team, "window", "Deploys run on Tuesdays")
    secret = await _fact(api, alice, team, "pager", "The pager password is hunter2")
    await run_job(api.runtime, CONSOLIDATION, job)
    before = await _the_summary(api)
    assert sorted(before["derived_from"]) == _ids(secret, window)
    assert "hunter2" in before["value"]

    await _delete(api, alice, secret)
    run = await run_job(api.runtime, CONSOLIDATION, job)
    assert (run.counts["summaries_written"], run.counts["unchanged"]) == (1, 0)
    after = await _the_summary(api)
    assert after["derived_from"] == _ids(window)
    assert "hunter2" not in after["value"]
    # Re-derived: the new version supersedes the old one in the same chain.
    assert after["version"] == before["version"] + 1
    [old] = [r for r in await summaries(api.runtime) if r["id"] == before["id"]]
    assert old["superseded_by"] == after["id"]
    # The old version held the deleted text: it is a content-free stub now, which no read
    # serves (it answered as 'superseded', with the text, before the rt13 fix).
    assert (old["value"], old["retracted_at"] is not None) == ("", True)
    got = await api.http.get(f"/v1/memories/{before['id']}", headers=alice.headers)
    assert got.status_code == 404


async def test_a_superseded_input_is_replaced_by_its_new_version(api: Api) -> None:
    alice, team, job = await _team(api, "read", "write", "delete")
    old = await _fact(api, alice, team, "window", "Deploys run on Tuesdays")
    await run_job(api.runtime, CONSOLIDATION, job)
    new = await _fact(api, alice, team, "window", "Deploys run on Thursdays")
    await run_job(api.runtime, CONSOLIDATION, job)
    summary = await _the_summary(api)
    assert summary["derived_from"] == _ids(new)
    assert old != new
    assert "Thursdays" in summary["value"]
    assert "Tuesdays" not in summary["value"]


async def test_an_expired_input_takes_its_summary_with_it_and_is_left_out(api: Api) -> None:
    alice, team, job = await _team(api, "read", "write", "delete")
    lasting = await _fact(api, alice, team, "window", "Deploys run on Tuesdays")
    brief = await _fact(api, alice, team, "freeze", "Code freeze this week", ttl_seconds=2)
    await run_job(api.runtime, CONSOLIDATION, job)
    first = await _the_summary(api)
    assert sorted(first["derived_from"]) == _ids(lasting, brief)
    # It never outlives an input: it expires with the first one that does.
    brief_row = (await api.http.get(f"/v1/memories/{brief}", headers=alice.headers)).json()
    assert first["expires_at"] == datetime.fromisoformat(brief_row["expires_at"])

    await asyncio.sleep(2.5)
    run = await run_job(api.runtime, CONSOLIDATION, job)
    assert run.counts["summaries_written"] == 1
    second = await _the_summary(api)
    assert second["derived_from"] == _ids(lasting)
    assert "freeze" not in second["value"]
    assert second["expires_at"] is None


async def test_a_summary_with_no_input_left_is_retracted(api: Api) -> None:
    alice, team, job = await _team(api, "read", "write", "delete")
    only = await _fact(api, alice, team, "window", "Deploys run on Tuesdays")
    await run_job(api.runtime, CONSOLIDATION, job)
    summary = await _the_summary(api)
    await _delete(api, alice, only)

    # The deletion retracts the summary built from it (rt13: it waited for the next run).
    assert live(await summaries(api.runtime)) == []
    run = await run_job(api.runtime, CONSOLIDATION, job)
    assert (run.counts["retracted"], run.counts["summaries_written"]) == (0, 0)
    [stub] = await summaries(api.runtime)
    assert stub["id"] == summary["id"]
    assert stub["value"] == ""  # a content-free stub
    hidden = await api.http.get(f"/v1/memories/{summary['id']}", headers=alice.headers)
    assert hidden.status_code == 404
    # And then there is nothing left to do.
    quiet = await run_job(api.runtime, CONSOLIDATION, job)
    assert quiet.counts["subjects_seen"] == 0


async def test_without_delete_the_job_writes_no_summary_and_a_deletion_takes_it_down(
    api: Api,
) -> None:
    # Before rt13 a summary left without inputs by a job without delete stayed live, with the
    # deleted text, counted `retract_refused`. Now the job writes summaries only where it can
    # also retract them, and the deletion itself retracts what its deleter may.
    alice, team, job = await _team(api, "read", "write", "delete")
    only = await _fact(api, alice, team, "window", "Deploys run on Tuesdays")
    await run_job(api.runtime, CONSOLIDATION, job)
    revoked = await api.http.delete(
        f"/v1/spaces/{team}/grants/delete/{service_subject(job)}", headers=api.admin.headers
    )
    assert revoked.status_code == 200, revoked.text
    await _delete(api, alice, only)
    assert live(await summaries(api.runtime)) == []
    run = await run_job(api.runtime, CONSOLIDATION, job)
    assert (run.counts["subjects_seen"], run.counts["summaries_written"]) == (0, 0)
    await _fact(api, alice, team, "window", "Deploys run on Fridays")
    again = await run_job(api.runtime, CONSOLIDATION, job)
    assert again.counts["summaries_written"] == 0
    assert live(await summaries(api.runtime)) == []


async def test_a_dry_run_counts_and_writes_nothing(api: Api) -> None:
    alice, team, job = await _team(api, "read", "write", "delete")
    await _fact(api, alice, team, "window", "Deploys run on Tuesdays")
    await _fact(api, alice, team, "owner", "Team search", subject="service:index")
    stored = await count_memories(api.runtime)
    dry = await run_job(api.runtime, CONSOLIDATION, job, dry_run=True)
    assert (dry.counts["subjects_seen"], dry.counts["summaries_written"]) == (2, 2)
    assert await count_memories(api.runtime) == stored
    real = await run_job(api.runtime, CONSOLIDATION, job)
    assert real.counts == dry.counts


async def test_external_context_is_left_out_by_the_space_source_policy(api: Api) -> None:
    alice, team, job = await _team(api, "read", "write", "delete")
    known = await _fact(api, alice, team, "window", "Deploys run on Tuesdays", source="runbook")
    web = await _fact(
        api, alice, team, "rumour", "A blog says search is deprecated", source="external:web"
    )
    run = await run_job(api.runtime, CONSOLIDATION, job)
    assert run.counts["inputs_excluded"] == 1
    summary = await _the_summary(api)
    assert summary["derived_from"] == _ids(known)
    assert "deprecated" not in summary["value"]

    # The space lets external context in: the next run re-derives with it.
    policy: dict[str, Any] = {"consolidation": {"excluded_sources": []}}
    put = await api.http.put(f"/v1/spaces/{team}/settings", json=policy, headers=api.admin.headers)
    assert put.status_code == 200, put.text
    again = await run_job(api.runtime, CONSOLIDATION, job)
    assert (again.counts["inputs_excluded"], again.counts["summaries_written"]) == (0, 1)
    assert sorted((await _the_summary(api))["derived_from"]) == _ids(known, web)


async def test_a_job_principal_without_grants_consolidates_nothing(api: Api) -> None:
    alice, team, job = await _team(api)  # no grant on the team space
    await _fact(api, alice, team, "window", "Deploys run on Tuesdays")
    stored = await count_memories(api.runtime)
    run = await run_job(api.runtime, CONSOLIDATION, job)
    assert run.counts["subjects_seen"] == 0
    assert run.counts["summaries_written"] == 0
    assert await count_memories(api.runtime) == stored

    # Read alone: it may read the space but writes only where it may write, so nothing.
    await grant(api, team, service_subject(job), "read")
    run = await run_job(api.runtime, CONSOLIDATION, job)
    assert (run.counts["subjects_seen"], run.counts["summaries_written"]) == (0, 0)
    assert await count_memories(api.runtime) == stored


async def test_small_batches_resume_and_repeat_to_the_same_result(api: Api) -> None:
    alice, team, job = await _team(api, "read", "write", "delete")
    for n in range(5):
        await _fact(api, alice, team, "fact", f"Fact number {n}", subject=f"service:s{n}")
    cursors: list[str | None] = []

    async def noting(batch: Batch) -> BatchDone:
        cursors.append(batch.cursor)
        return await Consolidation(batch).run()

    run = await run_job(api.runtime, CONSOLIDATION, job, size=2, batch_function=noting)
    assert run.batches == 3
    assert run.counts["summaries_written"] == 5
    written = await summaries(api.runtime)
    assert {r["subject"] for r in live(written)} == {f"service:s{n}" for n in range(5)}
    # A run killed after any batch and resumed from that batch's cursor: the batches run
    # again find their summaries unchanged, and nothing is written twice.
    for cursor in cursors:
        again = await run_job(api.runtime, CONSOLIDATION, job, size=2, start=cursor)
        assert again.counts["summaries_written"] == 0, cursor
        assert again.counts["unchanged"] == again.counts["subjects_seen"] > 0, cursor
    assert await summaries(api.runtime) == written


async def test_a_run_for_one_subject_touches_only_that_subject(api: Api) -> None:
    alice, team, job = await _team(api, "read", "write", "delete")
    await _fact(api, alice, team, "a", "Fact a", subject="service:a")
    await _fact(api, alice, team, "b", "Fact b", subject="service:b")
    run = await run_job(api.runtime, CONSOLIDATION, job, subject="service:a")
    assert run.counts["summaries_written"] == 1
    assert [r["subject"] for r in live(await summaries(api.runtime))] == ["service:a"]


async def test_a_cross_space_summary_goes_when_only_one_space_has_inputs(api: Api) -> None:
    alice = await api.new_agent("alice")
    search = await team_space(api, "search", alice)
    platform = await team_space(api, "platform", alice)
    job = await job_principal(api)
    for space in (search, platform):
        await grant(api, space, service_subject(job), "read", "write", "delete")
    policy = {"consolidation": {"with_spaces": [platform]}}
    put = await api.http.put(
        f"/v1/spaces/{search}/settings", json=policy, headers=api.admin.headers
    )
    assert put.status_code == 200, put.text
    mine = await _fact(api, alice, search, "window", "Deploys run on Tuesdays")
    theirs = await _fact(api, alice, platform, "cluster", "Three nodes")
    run = await run_job(api.runtime, CONSOLIDATION, job)
    assert run.counts["summaries_written"] == 3  # one per space, one across both
    [across] = [r for r in live(await summaries(api.runtime)) if r["key"] == "consolidation.across"]
    assert sorted(across["derived_from"]) == _ids(mine, theirs)
    assert across["read_requires"] == [uuid.UUID(platform)]

    await _delete(api, alice, theirs)
    # The platform space's own summary and the cross-space one were both built from it:
    # alice may retract both, so her deletion does (rt13: they waited for the next run).
    left = live(await summaries(api.runtime))
    assert [(r["key"], r["space_id"]) for r in left] == [("consolidation", uuid.UUID(search))]
    run = await run_job(api.runtime, CONSOLIDATION, job)
    assert (run.counts["retracted"], run.counts["summaries_written"]) == (0, 0)
    left = live(await summaries(api.runtime))
    assert [(r["key"], r["space_id"]) for r in left] == [("consolidation", uuid.UUID(search))]


class _Waiting(Extractive):
    """The extractive summarizer, held until `go` is set: a batch paused between its reads
    and its writes."""

    def __init__(self, go: asyncio.Event) -> None:
        super().__init__(4000)
        self._go = go

    async def summarize(self, subject: str, inputs: Sequence[Input]) -> str:
        await self._go.wait()
        return await super().summarize(subject, inputs)


async def test_two_runs_at_once_write_each_summary_once(api: Api) -> None:
    alice, team, job = await _team(api, "read", "write", "delete")
    for n in range(4):
        await _fact(api, alice, team, "fact", f"Fact number {n}", subject=f"service:s{n}")
    go = asyncio.Event()

    async def paused(batch: Batch) -> BatchDone:
        return await Consolidation(batch, _Waiting(go)).run()

    # The slow run reads everything, then waits; the other runs whole meanwhile.
    slow = asyncio.create_task(run_job(api.runtime, CONSOLIDATION, job, batch_function=paused))
    await asyncio.sleep(0.5)
    fast = await run_job(api.runtime, CONSOLIDATION, job)
    go.set()
    late = await slow
    assert fast.counts["summaries_written"] == 4
    # Under each summary's key lock the late run finds the very summary it was about to
    # write, and writes nothing.
    assert (late.counts["summaries_written"], late.counts["unchanged"]) == (0, 4)
    rows = await summaries(api.runtime)
    assert len(rows) == 4
    assert {r["version"] for r in rows} == {1}
