"""Nobody takes away a role from a principal whose powers exceed their own, the last policy
admin and the last auditor stay, and agents explain only themselves (review items 2 and 17)."""

from __future__ import annotations

from collections.abc import Sequence

from tests.fixtures.api import Agent, Api
from tests.integration.memory.support import assert_problem


async def _admin(api: Api, name: str, scopes: Sequence[str] = ("manage:policy",)) -> Agent:
    """A principal with an admin client of these scopes, in role:policy_admin."""
    principal = await api.new_principal(name)
    client = await api.new_client(principal["id"], scopes, kind="admin")
    token = await api.access_token(client["client"]["client_id"], client["client_secret"])
    added = await api.http.put(
        f"/v1/roles/policy_admin/members/{principal['id']}", headers=api.admin.headers
    )
    assert added.status_code == 200, added.text
    return Agent(principal["id"], client["client"]["client_id"], client["client_secret"], token)


async def _owner_still_administers(api: Api) -> None:
    for path in ("/v1/teams", "/v1/principals", "/v1/clients", "/v1/audit/events"):
        answer = await api.http.get(path, headers=api.admin.headers)
        assert answer.status_code == 200, (path, answer.text)


async def test_a_lower_policy_admin_cannot_lock_the_owner_out(api: Api) -> None:
    officer = await _admin(api, "officer")
    owner = api.admin.principal_id
    removed = await api.http.delete(
        f"/v1/roles/policy_admin/members/{owner}", headers=officer.headers
    )
    body = assert_problem(removed, 403, "insufficient-scope")
    assert "manage:tenant" in body["detail"]
    assert "read:audit" in body["detail"]
    audit = await api.http.delete(f"/v1/principals/{owner}/roles/auditor", headers=officer.headers)
    assert_problem(audit, 403, "insufficient-scope")
    await _owner_still_administers(api)
    # The owner, holding every scope, may still take the officer's role away.
    taken = await api.http.delete(
        f"/v1/roles/policy_admin/members/{officer.principal_id}", headers=api.admin.headers
    )
    assert taken.status_code == 200, taken.text
    again = await api.http.get("/v1/teams", headers=officer.headers)
    assert_problem(again, 403, "policy-admin-required")


async def test_a_lower_admin_cannot_hand_out_the_auditor_role(api: Api) -> None:
    officer = await _admin(api, "officer")
    bob = await api.new_principal("bob")
    granted = await api.http.put(
        f"/v1/principals/{bob['id']}/roles/auditor", headers=officer.headers
    )
    assert_problem(granted, 403, "insufficient-scope")
    owner_grant = await api.http.put(
        f"/v1/principals/{bob['id']}/roles/auditor", headers=api.admin.headers
    )
    assert owner_grant.status_code == 200, owner_grant.text


async def test_an_equal_admin_may_remove_but_the_last_auditor_stays(api: Api) -> None:
    deputy = await _admin(
        api,
        "deputy",
        ["manage:policy", "read:audit", "manage:erasure", "run:jobs", "manage:tenant"],
    )
    owner = api.admin.principal_id
    # An admin holding every admin scope the owner's clients hold may remove the owner's role.
    removed = await api.http.delete(
        f"/v1/roles/policy_admin/members/{owner}", headers=deputy.headers
    )
    assert removed.status_code == 200, removed.text
    lost = await api.http.get("/v1/teams", headers=api.admin.headers)
    assert_problem(lost, 403, "policy-admin-required")
    # The owner is the tenant's only auditor: that role stays.
    audit = await api.http.delete(f"/v1/principals/{owner}/roles/auditor", headers=deputy.headers)
    body = assert_problem(audit, 409, "last-role-holder")
    assert "auditor" in body["detail"]
    back = await api.http.put(f"/v1/roles/policy_admin/members/{owner}", headers=deputy.headers)
    assert back.status_code == 200, back.text
    await _owner_still_administers(api)
    # A second auditor lets the first one go; the remaining one stays.
    grant = await api.http.put(
        f"/v1/principals/{deputy.principal_id}/roles/auditor", headers=api.admin.headers
    )
    assert grant.status_code == 200, grant.text
    gone = await api.http.delete(f"/v1/principals/{owner}/roles/auditor", headers=deputy.headers)
    assert gone.status_code == 204, gone.text
    last = await api.http.delete(
        f"/v1/principals/{deputy.principal_id}/roles/auditor", headers=api.admin.headers
    )
    assert_problem(last, 409, "last-role-holder")
    events = await api.http.get("/v1/audit/events", headers=deputy.headers)
    assert events.status_code == 200, events.text


async def test_an_agent_with_read_policy_explains_only_itself(api: Api) -> None:
    bot_principal = await api.new_principal("bot", kind="agent")
    client = await api.new_client(bot_principal["id"], ["read:memory", "read:policy"])
    token = await api.access_token(client["client"]["client_id"], client["client_secret"])
    headers = {"Authorization": f"Bearer {token}"}
    own = await api.http.get(f"/v1/principals/{bot_principal['id']}/permissions", headers=headers)
    assert own.status_code == 200, own.text
    assert {p["space_id"] for p in own.json()["permissions"]} == {
        bot_principal["personal_space_id"]
    }
    alice = await api.new_principal("alice")
    other = await api.http.get(f"/v1/principals/{alice['id']}/permissions", headers=headers)
    body = assert_problem(other, 403, "policy-read-self-only")
    assert alice["personal_space_id"] not in other.text
    assert "own" in body["detail"]
    owner = await api.http.get(
        f"/v1/principals/{api.admin.principal_id}/permissions", headers=headers
    )
    assert_problem(owner, 403, "policy-read-self-only")
    space = alice["personal_space_id"]
    access = await api.http.get(f"/v1/spaces/{space}/access/read", headers=headers)
    assert_problem(access, 403, "policy-read-self-only")
    assert alice["id"] not in access.text
    # A user (or service) with read:policy still reads the tenant graph.
    reader = await api.new_agent("reader", scopes=["read:memory", "read:policy"])
    graph = await api.http.get(f"/v1/principals/{alice['id']}/permissions", headers=reader.headers)
    assert graph.status_code == 200, graph.text
    who = await api.http.get(f"/v1/spaces/{space}/access/read", headers=reader.headers)
    assert who.json()["principal_ids"] == [alice["id"]]
