"""Who may erase (scope and grant, each denial audited), another tenant's erasure (404 like a
random id), idempotent execution, stale plans, bad criteria, the plain-VACUUM choice."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.fixtures.api import Api, TestClient
from tests.integration.erasure.support import (
    CANARIES,
    ERASER_SCOPE,
    NAME,
    filed_person,
    make_eraser,
    plan,
)
from tests.integration.memory.support import assert_problem, count_memories, scalar

ERASURE_ROUTES = (
    ("POST", "/v1/erasures"),
    ("GET", "/v1/erasures/{id}"),
    ("POST", "/v1/erasures/{id}/plan"),
    ("POST", "/v1/erasures/{id}/execute"),
    ("GET", "/v1/erasures/{id}/proof"),
)
"""Every route of the erasure API (tests/integration/test_route_access.py leaves them to this
table)."""


def _ask(template: str, value: str) -> tuple[str, dict[str, Any]]:
    path = template.replace("{id}", value)
    body: dict[str, Any] = {"version": 1}
    if path == "/v1/erasures":
        body = {"subjects": ["user:1"], "reason": "request 1"}
    return path, body


async def _audited(api: Api, action: str, reason: str) -> int:
    count: int = await scalar(
        api.runtime,
        "SELECT count(*) FROM audit_events WHERE tenant_id = :t AND action = :a "
        "AND decision = 'deny' AND reason = :r",
        t=api.tenant_id,
        a=action,
        r=reason,
    )
    return count


@pytest.mark.parametrize(("method", "template"), ERASURE_ROUTES)
async def test_no_token_is_401(http: TestClient, method: str, template: str) -> None:
    path, body = _ask(template, str(uuid.uuid4()))
    for headers in ({}, {"Authorization": "Bearer not.a.jwt"}):
        response = await http.request(method, path, json=body, headers=headers)
        assert_problem(response, 401, "unauthenticated")
        assert response.headers["www-authenticate"].startswith("Bearer ")


@pytest.mark.parametrize(("method", "template"), ERASURE_ROUTES)
async def test_without_manage_erasure_is_403_and_audited(
    api: Api, method: str, template: str
) -> None:
    await make_eraser(api)
    agent = await api.new_agent("alice")
    asked = await api.token_response(agent.client_id, agent.secret, f"{ERASER_SCOPE} read:memory")
    assert asked.json()["scope"].split() == ["read:memory"]  # never issued to an agent
    narrowed = await api.access_token(api.admin.client_id, api.admin.secret, "read:memory")
    path, body = _ask(template, str(uuid.uuid4()))
    for token in (agent.token, asked.json()["access_token"], narrowed):
        response = await api.http.request(
            method, path, json=body, headers={"Authorization": f"Bearer {token}"}
        )
        problem = assert_problem(response, 403, "insufficient-scope")
        assert problem["required_scope"] == ERASER_SCOPE
    assert await scalar(api.runtime, "SELECT count(*) FROM erasure_plans") == 0


@pytest.mark.parametrize(("method", "template"), ERASURE_ROUTES)
async def test_without_the_eraser_role_is_403_and_audited(
    api: Api, method: str, template: str
) -> None:
    path, body = _ask(template, str(uuid.uuid4()))
    response = await api.http.request(method, path, json=body, headers=api.admin.headers)
    problem = assert_problem(response, 403, "eraser-role-required")
    assert "roles/eraser" in problem["detail"]
    actions = {
        "/v1/erasures": "erasure.plan",
        "/plan": "erasure.replan",
        "/execute": "erasure.execute",
        "/proof": "erasure.proof",
    }
    action = next((a for end, a in actions.items() if path.endswith(end)), "erasure.get")
    assert await _audited(api, action, "eraser-role-required") == 1
    assert await scalar(api.runtime, "SELECT count(*) FROM erasure_plans") == 0


async def test_granting_the_eraser_role_needs_manage_erasure(api: Api) -> None:
    bob = await api.new_principal("bob", kind="user")
    narrowed = await api.access_token(api.admin.client_id, api.admin.secret, "manage:policy")
    refused = await api.http.put(
        f"/v1/principals/{bob['id']}/roles/eraser",
        headers={"Authorization": f"Bearer {narrowed}"},
    )
    problem = assert_problem(refused, 403, "insufficient-scope")
    assert problem["required_scope"] == ERASER_SCOPE


async def test_another_tenants_erasure_is_404_like_a_random_id(api: Api) -> None:
    other = await api.other_tenant()
    await make_eraser(other)
    await make_eraser(api)
    theirs = await other.http.post(
        "/v1/erasures",
        json={"subjects": ["user:1"], "reason": "request 2"},
        headers=other.admin.headers,
    )
    assert theirs.status_code == 201, theirs.text
    foreign = theirs.json()["id"]
    for method, template in ERASURE_ROUTES[1:]:
        fresh = str(uuid.uuid4())
        path, body = _ask(template, fresh)
        baseline = await api.http.request(method, path, json=body, headers=api.admin.headers)
        assert_problem(baseline, 404, "erasure-not-found")
        path, body = _ask(template, foreign)
        response = await api.http.request(method, path, json=body, headers=api.admin.headers)
        assert_problem(response, 404, "erasure-not-found")
        assert response.content.replace(foreign.encode(), b"{id}") == baseline.content.replace(
            fresh.encode(), b"{id}"
        )
    still = await other.http.get(f"/v1/erasures/{foreign}", headers=other.admin.headers)
    assert still.json()["state"] == "planned"


async def test_criteria_naming_another_tenants_principal_or_memory_is_404(api: Api) -> None:
    other = await api.other_tenant()
    await make_eraser(api)
    stranger = await other.new_agent("mallory")
    theirs = await other.remember(stranger, value="their own memory")
    for body, slug in (
        ({"owners": [stranger.principal_id]}, "principal-not-found"),
        ({"memory_ids": [theirs["id"]]}, "memory-not-found"),
        ({"memory_ids": [str(uuid.uuid4())]}, "memory-not-found"),
        ({"names": [NAME]}, "erasure-criteria-empty"),
    ):
        response = await api.http.post(
            "/v1/erasures", json={"reason": "request 3"} | body, headers=api.admin.headers
        )
        assert_problem(response, 422 if slug == "erasure-criteria-empty" else 404, slug)
    assert await scalar(api.runtime, "SELECT count(*) FROM erasure_plans") == 0


async def test_a_reason_that_names_the_person_is_refused(api: Api) -> None:
    await make_eraser(api)
    person = await filed_person(api)
    response = await plan(api, person, reason=f"request of {NAME}")
    assert_problem(response, 422, "reason-quotes-content")
    assert await scalar(api.runtime, "SELECT count(*) FROM erasure_plans") == 0


async def test_the_reason_is_no_oracle_for_text_the_eraser_cannot_read(api: Api) -> None:
    """Red team, finding 3: a reason refused for quoting an erased value told the eraser, who
    never sees the values, whether a guess was the text. The reason is checked against the
    plan's names only."""
    await make_eraser(api)
    person = await filed_person(api)
    right = await plan(api, person, names=[], reason=f"ref {CANARIES['note']}")
    wrong = await plan(api, person, names=[], reason="ref zq7-canary-reorg Bob thinks otherwise")
    assert (right.status_code, wrong.status_code) == (201, 201)
    assert right.json()["counts"] == wrong.json()["counts"]


async def test_execution_is_idempotent_and_refuses_a_stale_plan(api: Api) -> None:
    await make_eraser(api)
    person = await filed_person(api)
    first = (await plan(api, person)).json()
    # Alice writes again after the plan: the plan no longer covers what it would erase.
    await api.remember(person.alice, subject="service:later", key="later", value="written later")
    before = await count_memories(api.runtime)
    stale = await api.http.post(
        f"/v1/erasures/{first['id']}/execute", json={"version": 1}, headers=api.admin.headers
    )
    problem = assert_problem(stale, 409, "erasure-plan-stale")
    assert "changed since it was planned" in problem["detail"]
    assert await count_memories(api.runtime) == before

    again = await api.http.post(f"/v1/erasures/{first['id']}/plan", headers=api.admin.headers)
    assert again.status_code == 200, again.text
    assert again.json()["version"] == 2
    assert again.json()["counts"]["by_owner"] == first["counts"]["by_owner"] + 1
    wrong = await api.http.post(
        f"/v1/erasures/{first['id']}/execute", json={"version": 1}, headers=api.admin.headers
    )
    assert_problem(wrong, 409, "erasure-plan-stale")

    done = await api.http.post(
        f"/v1/erasures/{first['id']}/execute", json={"version": 2}, headers=api.admin.headers
    )
    assert done.status_code == 200, done.text
    after = await count_memories(api.runtime)
    assert after == before - 7
    repeat = await api.http.post(
        f"/v1/erasures/{first['id']}/execute", json={"version": 2}, headers=api.admin.headers
    )
    assert repeat.status_code == 200, repeat.text
    assert repeat.json() == done.json()
    assert await count_memories(api.runtime) == after
    replanned = await api.http.post(f"/v1/erasures/{first['id']}/plan", headers=api.admin.headers)
    assert_problem(replanned, 409, "erasure-plan-stale")
    executed = await api.http.get(f"/v1/erasures/{first['id']}", headers=api.admin.headers)
    assert executed.json()["state"] == "executed"
    assert executed.json()["receipt"] == done.json()["receipt"]
    assert person.alice.principal_id not in executed.json()["owners"]
    finalised = await scalar(
        api.runtime,
        "SELECT count(*) FROM audit_events WHERE tenant_id = :t AND action = 'erasure.finalize' "
        "AND decision = 'allow'",
        t=api.tenant_id,
    )
    assert finalised == 1


async def test_without_tombstones_the_text_may_be_written_again(api: Api) -> None:
    await make_eraser(api)
    person = await filed_person(api)
    body = (await plan(api, person, keep_tombstones=False)).json()
    done = await api.http.post(
        f"/v1/erasures/{body['id']}/execute", json={"version": 1}, headers=api.admin.headers
    )
    assert done.json()["claims"]["tombstones_kept"] is False
    assert "tombstones" not in done.json()["claims"]["counts"]
    written = await api.remember(person.bob, subject="service:x", key="y", value=CANARIES["note"])
    assert written["value"] == CANARIES["note"]


async def test_a_plain_vacuum_is_reported_as_leaving_bytes_in_free_space(api: Api) -> None:
    """Without the rewrite the proof does not claim the files are clean: the scan finds what
    a plain VACUUM left in free space (reliability.md §3.2)."""
    await make_eraser(api)
    person = await filed_person(api)
    body = (await plan(api, person, rewrite=False)).json()
    done = await api.http.post(
        f"/v1/erasures/{body['id']}/execute", json={"version": 1}, headers=api.admin.headers
    )
    assert "free space" in done.json()["claims"]["guarantees"]["files"]
    proof = (
        await api.http.get(f"/v1/erasures/{body['id']}/proof", headers=api.admin.headers)
    ).json()
    facts = proof["evidence"]
    assert proof["rows_left"] == 0
    assert facts["vacuum"]["full"] is False
    assert any(found > 0 for found in facts["files_after"]["found"])


async def test_the_plans_names_are_never_looked_for_in_the_files(api: Api) -> None:
    """Red team, finding 1: the files hold every tenant's rows, so a name scanned there told
    whether another tenant stores a guessed text. And an execution that erases nothing
    rewrites no shared table (finding 2)."""
    other = await api.other_tenant()
    stranger = await other.new_agent("mallory")
    await other.remember(stranger, value="zq8-globex-secret merger with initech at 4.2B")
    await make_eraser(api)
    planned = await api.http.post(
        "/v1/erasures",
        json={
            "subjects": ["service:nobody"],
            "names": ["merger with initech at 4.2B", "merger with initech at 9.9B"],
            "reason": "request 9",
        },
        headers=api.admin.headers,
    )
    assert planned.status_code == 201, planned.text
    assert planned.json()["review"] == []
    done = await api.http.post(
        f"/v1/erasures/{planned.json()['id']}/execute",
        json={"version": 1},
        headers=api.admin.headers,
    )
    assert done.status_code == 200, done.text
    assert done.json()["claims"]["counts"]["memories"] == 0
    proof = (
        await api.http.get(f"/v1/erasures/{planned.json()['id']}/proof", headers=api.admin.headers)
    ).json()
    facts = proof["evidence"]
    assert facts["needles"]["values"] == 0
    assert facts["files_before"] == {"scanned": False, "why": "nothing to look for"}
    assert "files_after" not in facts
    assert "vacuum" not in facts
    assert facts["finalized"] is True
    finalised = await scalar(
        api.runtime,
        "SELECT count(*) FROM audit_events WHERE tenant_id = :t AND action = 'erasure.finalize'",
        t=api.tenant_id,
    )
    assert finalised == 0
