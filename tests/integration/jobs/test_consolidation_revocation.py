"""memory.consolidate and revocation (promise 7): the job's write takes the tenant's
revocation lock shared, as a REST write does; a summary a standing revocation covers (its value is a
revoked claim of its space) is stored hidden, once, and comes back with a reinstate."""

from __future__ import annotations

from typing import Any

from service.consolidation.jobs import CONSOLIDATION
from tests.fixtures.api import Agent, Api
from tests.integration.jobs.consolidation_support import (
    grant,
    job_principal,
    run_job,
    service_subject,
    summaries,
    team_space,
)
from tests.integration.memory.revocation_support import reinstate, revoke
from tests.integration.memory.support import scalar

SUBJECT = "policy:purchasing"
LIMIT = "Manager limit is 3000 EUR per order"


async def _write(api: Api, agent: Agent, team: str, key: str, value: str, **fields: Any) -> Any:
    body = {"subject": SUBJECT, "kind": "fact", "key": key, "value": value, "space_id": team}
    response = await api.http.post(
        "/v1/memories", json=body | {"new_key": True} | fields, headers=agent.headers
    )
    assert response.status_code == 201, response.text
    return response.json()["memory"]


async def _setup(api: Api) -> tuple[Agent, Agent, str, Any]:
    alice = await api.new_agent("alice")
    bob = await api.new_agent("bob", scopes=("read:memory",))
    team = await team_space(api, "purchasing", alice, bob)
    job = await job_principal(api)
    await grant(api, team, service_subject(job), "read", "write", "delete")
    return alice, bob, team, job


async def test_a_summary_that_spells_a_revoked_claim_is_stored_hidden_once(api: Api) -> None:
    alice, bob, team, job = await _setup(api)
    await _write(api, alice, team, "approval.limit", LIMIT)
    # The extractive summary of that one input is "approval.limit: <value>": the same claim,
    # written and revoked in the team space under another subject.
    claim = await _write(
        api, alice, team, "copied", f"approval.limit: {LIMIT}.", subject="notes:copied"
    )
    await revoke(api, alice, claim["id"], "withdrawn by the CFO")
    first = await run_job(api.runtime, CONSOLIDATION, job, subject=SUBJECT)
    assert first.counts.get("summaries_hidden") == 1, first.counts
    assert first.counts["summaries_written"] == 0
    [summary] = await summaries(api.runtime)
    hidings = await scalar(
        api.runtime, "SELECT count(*) FROM memory_hidings WHERE memory_id = :id", id=summary["id"]
    )
    assert hidings == 1
    seen = await api.http.get(f"/v1/memories/{summary['id']}", headers=bob.headers)
    assert seen.status_code == 404, seen.text
    again = await run_job(api.runtime, CONSOLIDATION, job, subject=SUBJECT)
    assert again.counts.get("summaries_hidden", 0) == 0, again.counts
    assert len(await summaries(api.runtime)) == 1  # not one more hidden row per run
    await reinstate(api, alice, claim["id"], "the CFO changed her mind")
    back = await api.http.get(f"/v1/memories/{summary['id']}", headers=bob.headers)
    assert back.status_code == 200, back.text
