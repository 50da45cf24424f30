"""Reading the audit log: the auditor role on top of `read:audit`, the caller's tenant only,
filters by time, actor, action, decision and target, and cursor pagination."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.fixtures.api import Api
from tests.integration.audit.support import auditor_get
from tests.integration.memory.support import assert_problem

EVENTS = "/v1/audit/events"


async def _events(api: Api, **params: Any) -> dict[str, Any]:
    response = await auditor_get(api, EVENTS, **params)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def test_an_admin_without_the_auditor_role_is_refused(api: Api) -> None:
    officer = await api.new_principal("officer", kind="user")
    client = await api.new_client(officer["id"], ["read:audit", "manage:policy"], kind="admin")
    token = await api.access_token(client["client"]["client_id"], client["client_secret"])
    headers = {"Authorization": f"Bearer {token}"}
    refused = await api.http.get(EVENTS, headers=headers)
    assert_problem(refused, 403, "auditor-role-required")
    assert "items" not in refused.text

    granted = await api.http.put(
        f"/v1/principals/{officer['id']}/roles/auditor", headers=api.admin.headers
    )
    assert granted.status_code == 200, granted.text
    assert granted.json() == {"principal_id": officer["id"], "role": "auditor"}
    assert (await api.http.get(EVENTS, headers=headers)).status_code == 200

    revoked = await api.http.delete(
        f"/v1/principals/{officer['id']}/roles/auditor", headers=api.admin.headers
    )
    assert revoked.status_code == 204
    assert_problem(await api.http.get(EVENTS, headers=headers), 403, "auditor-role-required")


async def test_an_unknown_role_is_refused_and_grants_nothing(api: Api) -> None:
    officer = await api.new_principal("officer", kind="user")
    response = await api.http.put(
        f"/v1/principals/{officer['id']}/roles/admin", headers=api.admin.headers
    )
    assert response.status_code in {400, 422}, response.text
    assert response.headers["content-type"].startswith("application/problem+json")


async def test_each_tenant_reads_only_its_own_log(api: Api) -> None:
    other = await api.other_tenant()
    bob = await other.new_agent("bob")
    bobs = await other.remember(bob, key="bob.k", value="bob")
    mine = await _events(api, limit=200)
    assert mine["items"]
    assert {item["tenant_id"] for item in mine["items"]} == {api.tenant_id}
    # Another tenant's target id as a filter finds nothing (the events exist, in its own log).
    assert (await _events(api, target=bobs["id"]))["items"] == []
    theirs = await _events(other, target=bobs["id"])
    assert [item["action"] for item in theirs["items"]] == ["memory.write"]
    # Another tenant's actor (by principal id) finds nothing either.
    assert (await _events(api, actor=bob.principal_id))["items"] == []
    assert (await _events(other, actor=bob.principal_id))["items"]


async def test_filters_select_what_they_name(api: Api) -> None:
    alice = await api.new_agent("alice")
    written = await api.remember(alice, key="k.1", value="one")
    await api.http.get(f"/v1/memories/{uuid.uuid4()}", headers=alice.headers)  # 404: deny
    await api.search(alice, "one")

    by_actor = await _events(api, actor=alice.principal_id)
    actions = [item["action"] for item in by_actor["items"]]
    assert actions == ["memory.search", "memory.get", "memory.write", "auth.token"]
    pseudonym = by_actor["items"][0]["actor"]
    assert (await _events(api, actor=pseudonym))["items"] == by_actor["items"]

    denied = await _events(api, decision="deny")
    assert [(i["action"], i["status"], i["reason"]) for i in denied["items"]] == [
        ("memory.get", 404, "memory-not-found")
    ]
    writes = await _events(api, action="memory.write")
    assert [i["target_ids"] for i in writes["items"]] == [[written["id"]]]
    targeted = await _events(api, target=written["id"])
    assert {i["action"] for i in targeted["items"]} == {"memory.write", "memory.search"}

    now = datetime.now(UTC)
    assert (await _events(api, since=(now + timedelta(minutes=1)).isoformat()))["items"] == []
    window = await _events(
        api, since=(now - timedelta(minutes=5)).isoformat(), until=now.isoformat()
    )
    assert len(window["items"]) >= 4


async def test_pages_walk_the_whole_log_newest_first_without_overlap(api: Api) -> None:
    alice = await api.new_agent("alice")
    for _ in range(7):
        await api.http.get("/v1/memories", headers=alice.headers)
    everything = (await _events(api, limit=200))["items"]
    seen: list[int] = []
    cursor = None
    while True:
        page = await _events(api, limit=3, cursor=cursor)
        seen += [item["seq"] for item in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    # The reads of the log are audited too, so each page call adds rows above the first page.
    first_seq = everything[0]["seq"]
    assert [s for s in seen if s <= first_seq] == [item["seq"] for item in everything]
    assert seen == sorted(seen, reverse=True)
    assert len(seen) == len(set(seen))


@pytest.mark.parametrize(
    ("params", "status", "slug"),
    [
        ({"cursor": "not-a-cursor"}, 400, "bad-cursor"),
        ({"limit": 0}, 422, "audit-filter-invalid"),
        ({"limit": 201}, 422, "audit-filter-invalid"),
        ({"actor": "someone@example.com"}, 422, "audit-filter-invalid"),
        ({"target": "not-a-uuid"}, 400, "malformed-id"),
        ({"action": "DROP TABLE"}, 400, None),
        ({"decision": "maybe"}, 400, None),
        ({"since": "yesterday"}, 400, None),
    ],
)
async def test_bad_filters_are_problems(
    api: Api, params: dict[str, Any], status: int, slug: str | None
) -> None:
    response = await auditor_get(api, EVENTS, **params)
    allowed = {status} if slug is not None else {400, 422}
    assert response.status_code in allowed, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    if slug is not None:
        assert_problem(response, status, slug)
