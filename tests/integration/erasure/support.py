"""A person filed under several subjects and spaces, for the erasure tests: Alice's private
notes (one under another subject), her team facts, versions of one key, a team summary built
from her note by the consolidation job, and a teammate's fact that mentions her by name."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx

from service.consolidation.jobs import CONSOLIDATION
from tests.fixtures.api import Agent, Api
from tests.integration.jobs.consolidation_support import (
    grant,
    job_principal,
    run_job,
    service_subject,
    team_space,
)

NAME = "Alice Liddell"
CANARIES = {
    "note": "zq7-canary-reorg Alice thinks the search reorg will fail",
    "preference": "zq7-canary-pref prefers standups after ten",
    "team": "zq7-canary-team the retry runbook draft lives in the wiki",
    "first": "zq7-canary-first deploy window is Monday",
    "second": "zq7-canary-second deploy window is Tuesday",
}
"""Alice's texts: every one must be gone from every surface after her erasure."""
MENTION = "Alice Liddell owns the billing retry runbook"
"""Bob's team fact that names her: listed for review, not erased."""
ERASER_SCOPE = "manage:erasure"


@dataclass
class Person:
    alice: Agent
    bob: Agent
    team: str
    ids: dict[str, str] = field(default_factory=dict)
    summary_id: str = ""


async def make_eraser(api: Api) -> None:
    """The tenant admin grants itself the eraser role (never seeded)."""
    granted = await api.http.put(
        f"/v1/principals/{api.admin.principal_id}/roles/eraser", headers=api.admin.headers
    )
    assert granted.status_code == 200, granted.text


async def filed_person(api: Api) -> Person:
    alice = await api.new_agent("alice")
    bob = await api.new_agent("bob")
    team = await team_space(api, "search", alice, bob)
    job = await job_principal(api)
    await grant(api, team, service_subject(job), "read", "write", "delete")
    person = Person(alice, bob, team)
    remember = api.remember
    # A private note she filed under a service's subject, not her own.
    person.ids["note"] = (
        await remember(alice, subject="service:search", key="reorg", value=CANARIES["note"])
    )["id"]
    person.ids["preference"] = (
        await remember(
            alice, subject=f"user:{alice.principal_id}", key="standup", value=CANARIES["preference"]
        )
    )["id"]
    person.ids["team"] = (
        await remember(
            alice, subject="service:search", key="runbook", value=CANARIES["team"], space_id=team
        )
    )["id"]
    person.ids["first"] = (
        await remember(alice, subject="service:deploys", key="window", value=CANARIES["first"])
    )["id"]
    second = await api.http.post(
        "/v1/memories",
        json={
            "subject": "service:deploys",
            "kind": "fact",
            "key": "window",
            "value": CANARIES["second"],
        },
        headers=alice.headers,
    )
    assert second.status_code == 201, second.text
    person.ids["second"] = second.json()["memory"]["id"]
    person.ids["mention"] = (
        await remember(bob, subject="service:search", key="owner", value=MENTION, space_id=team)
    )["id"]
    run = await run_job(api.runtime, CONSOLIDATION, job)
    assert run.counts["summaries_written"] == 1, run.counts
    listed = await api.http.get(
        "/v1/memories", params={"space_id": team, "kind": "summary"}, headers=bob.headers
    )
    assert listed.status_code == 200, listed.text
    [summary] = listed.json()["items"]
    assert CANARIES["team"] in summary["value"]  # built from her note
    person.summary_id = summary["id"]
    return person


async def plan(api: Api, person: Person, **body: Any) -> httpx.Response:
    return await api.http.post(
        "/v1/erasures",
        json={
            "subjects": [f"user:{person.alice.principal_id}"],
            "owners": [person.alice.principal_id],
            "names": [NAME],
            "reason": "GDPR art. 17 request 2026-114",
        }
        | body,
        headers=api.admin.headers,
    )


def assert_no_canary(text: str, where: str) -> None:
    for canary in CANARIES.values():
        assert canary not in text, f"{canary!r} in {where}"
    assert "zq7-canary" not in text, where
