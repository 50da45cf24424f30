"""Revocation that holds (issue 15, promise 7), the paper's scenario: an old approval policy and
its replacement; the old one is revoked; its text re-written (exactly, and with invisible
characters and another case), an agent's conclusion derived from it (before and after the
revocation), and a summary consolidated before it: none reaches any reader on any surface
(search, both legs, get, list, counts, history, MCP); the replacement still does; reinstating
the old one brings exactly those back."""

from __future__ import annotations

import json
from typing import Any

from service.consolidation.jobs import CONSOLIDATION
from service.runtime import Runtime
from tests.fixtures.api import Agent, Api
from tests.integration.jobs.consolidation_support import (
    grant,
    job_principal,
    live,
    run_job,
    service_subject,
    summaries,
    team_space,
)
from tests.integration.mcp.support import error_text, mcp_session, payload, serving
from tests.integration.memory.revocation_support import (
    counts,
    mcp_surfaces,
    reinstate,
    revoke,
    surfaces,
)
from tests.integration.memory.support import memory_rows

SUBJECT = "policy:purchasing"
OLD = "Purchases above 5000 EUR need one manager approval"
NEW = "Purchases above 5000 EUR need two approvals, manager and finance"
QUERY = "approval for purchases above 5000 EUR"
RESULTS: dict[str, Any] = {}
"""The per-surface results, written to the report (see `test_the_papers_scenario`)."""


async def _write(api: Api, agent: Agent, team: str, key: str, value: str, **fields: Any) -> Any:
    body: dict[str, Any] = {"subject": SUBJECT, "kind": "fact", "key": key, "value": value}
    body |= {"space_id": team, "new_key": True}
    response = await api.http.post("/v1/memories", json=body | fields, headers=agent.headers)
    assert response.status_code == 201, response.text
    return response.json()


def _table(seen: dict[str, set[str]], named: dict[str, str]) -> dict[str, list[str]]:
    by_id = {memory_id: name for name, memory_id in named.items()}
    return {surface: sorted(by_id[i] for i in ids) for surface, ids in seen.items()}


async def test_the_papers_scenario(api: Api, runtime: Runtime) -> None:
    alice = await api.new_agent("alice")  # the policy owner: read, write, delete
    agent = await api.new_agent("agent")  # an agent acting on the policy
    bob = await api.new_agent("bob", scopes=("read:memory",))  # a reader
    team = await team_space(api, "purchasing", alice, agent, bob)
    job = await job_principal(api)
    await grant(api, team, service_subject(job), "read", "write", "delete")

    old = (await _write(api, alice, team, "approval.policy.2025", OLD))["memory"]
    new = (await _write(api, alice, team, "approval.policy", NEW))["memory"]
    conclusion = (
        await _write(
            api,
            agent,
            team,
            "po.4711",
            "PO 4711 for 7200 EUR was approved by one manager, as policy allows",
            kind="decision",
            derived_from=[old["id"]],
        )
    )["memory"]
    await run_job(api.runtime, CONSOLIDATION, job, subject=SUBJECT)
    [summary] = live(await summaries(api.runtime))
    assert str(old["id"]) in {str(i) for i in summary["derived_from"]}
    named = {
        "old": old["id"],
        "new": new["id"],
        "conclusion": conclusion["id"],
        "summary": str(summary["id"]),
    }
    before = await surfaces(api, bob, QUERY, list(named.values()))
    assert all(
        {"old", "new", "conclusion", "summary"} <= set(_table(before, named)[s])
        for s in ("list", "get", "search:vector", "history")
    ), _table(before, named)
    count_before = await counts(api, bob)

    revoked = await revoke(api, alice, old["id"], "withdrawn by the CFO on 2026-11-30")
    assert revoked["memory_id"] == old["id"]
    assert revoked["hidden"] == 3  # the policy, the conclusion, the summary

    exact = await _write(api, agent, team, "approval.copy", OLD)
    variant = await _write(
        api,
        agent,
        team,
        "approval.variant",
        "PURCHASES above\u200d 5000 EUR need one mana\u00adger approval\ufe0f",
    )
    later = await _write(
        api,
        agent,
        team,
        "po.4712",
        "PO 4712 for 9100 EUR approved by one manager",
        kind="decision",
        derived_from=[old["id"]],
    )
    for written, because in (
        (exact, "content-revoked"),
        (variant, "content-revoked"),
        (later, "derived-from-hidden"),
    ):
        assert written["memory"]["status"] == "hidden", written
        assert written["hidden"]["because"] == because
    named |= {
        "copy": exact["memory"]["id"],
        "variant": variant["memory"]["id"],
        "later_conclusion": later["memory"]["id"],
    }
    hidden = {"old", "conclusion", "summary", "copy", "variant", "later_conclusion"}

    readers = {"bob": bob, "alice": alice, "agent": agent}
    after: dict[str, dict[str, list[str]]] = {}
    for name, reader in readers.items():
        seen = _table(await surfaces(api, reader, QUERY, list(named.values())), named)
        seen |= _table(await mcp_surfaces(runtime, reader, QUERY, list(named.values())), named)
        after[name] = seen
        for surface, shown in seen.items():
            assert not hidden & set(shown), (name, surface, shown)
        assert "new" in seen["list"]
        assert "new" in seen["get"]
        assert "new" in seen["mcp:get"]
        assert "new" in seen["search:vector"]
        assert "new" in seen["mcp:recall"]
    assert await counts(api, bob) == count_before - 3

    # The job re-derives the summary without the revoked input.
    await run_job(api.runtime, CONSOLIDATION, job, subject=SUBJECT)
    [rederived] = await summaries(
        api.runtime, "revoked_at IS NULL AND superseded_at IS NULL AND retracted_at IS NULL"
    )
    assert [str(i) for i in rederived["derived_from"]] == [new["id"]]
    assert "one manager approval" not in rederived["value"]
    assert "two approvals" in rederived["value"]

    restored = await reinstate(api, alice, old["id"], "the CFO withdrew the withdrawal")
    assert restored["restored"] == 6
    back = _table(await surfaces(api, bob, QUERY, list(named.values())), named)
    assert set(back["get"]) == set(named)  # the old summary too, now superseded
    # The old summary came back into a key that has a live summary: closed by it.
    [old_summary] = await memory_rows(api.runtime, "id = :id", id=summary["id"])
    assert old_summary["superseded_by"] == rederived["id"]
    assert set(back["list"]) == set(named) - {"summary"}
    RESULTS.update(
        before=_table(before, named),
        after_revoke=after,
        after_reinstate=back,
        counts={"before": count_before, "after": count_before - 3},
    )
    print("REVOCATION-RESULTS " + json.dumps(RESULTS, sort_keys=True))


async def test_revoke_and_reinstate_through_the_mcp_client(api: Api, runtime: Runtime) -> None:
    alice = await api.new_agent("alice")
    memory = await api.remember(alice, key="approval.policy", value=OLD)
    async with serving(runtime) as base, mcp_session(base, alice.token) as session:
        quoting = await session.call_tool(
            "revoke", {"id": memory["id"], "reason": "above 5000 eur is gone"}
        )
        revoked = payload(
            await session.call_tool("revoke", {"id": memory["id"], "reason": "withdrawn"})
        )
        gone = await session.call_tool("get_memory", {"id": memory["id"]})
        copy = payload(
            await session.call_tool(
                "remember",
                {
                    "subject": "service:billing",
                    "kind": "fact",
                    "key": "again",
                    "value": OLD,
                    "new_key": True,
                },
            )
        )
        refused = await session.call_tool("reinstate", {"id": copy["memory"]["id"], "reason": "x"})
        stale = await session.call_tool(
            "reinstate", {"id": memory["id"], "reason": "back", "if_match": copy["memory"]["etag"]}
        )
        reinstated = payload(
            await session.call_tool(
                "reinstate", {"id": memory["id"], "reason": "back", "if_match": memory["etag"]}
            )
        )
        back = await session.call_tool("get_memory", {"id": memory["id"]})
    assert "reason-quotes-content" in error_text(quoting)
    assert (revoked["memory_id"], revoked["hidden"]) == (memory["id"], 1)
    assert "memory-not-found" in error_text(gone)
    assert copy["memory"]["status"] == "hidden"
    assert "not-the-revoked-memory" in error_text(refused)
    assert "precondition-failed" in error_text(stale)
    assert (reinstated["memory_id"], reinstated["restored"]) == (memory["id"], 2)
    assert not back.is_error
