"""Red-team F4: registering a client can never hand out more than the caller holds."""

from __future__ import annotations

from typing import Any

import httpx

from tests.fixtures.api import Agent, Api


async def _narrow_admin(api: Api, scopes: list[str]) -> tuple[dict[str, Any], dict[str, str]]:
    me = await api.new_principal("policy-admin")
    made = await api.http.put(
        f"/v1/roles/policy_admin/members/{me['id']}", headers=api.admin.headers
    )
    assert made.status_code == 200, made.text
    created = await api.new_client(me["id"], scopes, kind="admin")
    token = await api.access_token(created["client"]["client_id"], created["client_secret"])
    return me, {"Authorization": f"Bearer {token}"}


async def _register(api: Api, headers: dict[str, str], **body: Any) -> httpx.Response:
    response: httpx.Response = await api.http.post(
        "/v1/clients", json={"name": "ceiling"} | body, headers=headers
    )
    return response


async def _client_count(api: Api) -> int:
    listed = await api.http.get("/v1/clients", headers=api.admin.headers)
    return len(listed.json()["items"])


async def test_a_narrow_admin_cannot_widen_itself(api: Api) -> None:
    me, headers = await _narrow_admin(api, ["manage:policy"])
    before = await _client_count(api)
    wider = await _register(
        api,
        headers,
        principal_id=me["id"],
        kind="admin",
        scopes=["manage:policy", "manage:tenant", "read:audit"],
    )
    assert wider.status_code == 422, wider.text
    problem = wider.json()
    assert problem["type"].endswith("/scope-not-allowed")
    assert "manage:tenant" in problem["detail"]
    assert "read:audit" in problem["detail"]
    assert await _client_count(api) == before
    same = await _register(
        api, headers, principal_id=me["id"], kind="admin", scopes=["manage:policy"]
    )
    assert same.status_code == 201, same.text


async def test_agent_principals_never_get_admin_clients(api: Api) -> None:
    bot = await api.new_principal("bot", kind="agent")
    before = await _client_count(api)
    for body in (
        {"kind": "admin", "scopes": ["manage:policy"]},
        {"kind": "admin", "scopes": ["read:memory"]},
    ):
        refused = await _register(api, api.admin.headers, principal_id=bot["id"], **body)
        assert refused.status_code == 422, refused.text
        assert refused.json()["type"].endswith("/scope-not-allowed")
    assert await _client_count(api) == before
    agent_client = await _register(
        api, api.admin.headers, principal_id=bot["id"], kind="agent", scopes=["read:memory"]
    )
    assert agent_client.status_code == 201, agent_client.text


async def test_acting_as_another_principal_needs_manage_tenant(api: Api) -> None:
    alice = await api.new_agent("alice")
    await api.remember(alice, key="diary", value="alice private diary")
    _, headers = await _narrow_admin(api, ["manage:policy", "read:memory"])
    before = await _client_count(api)
    refused = await _register(
        api, headers, principal_id=alice.principal_id, kind="agent", scopes=["read:memory"]
    )
    assert refused.status_code == 403, refused.text
    assert refused.json()["required_scope"] == "manage:tenant"
    assert "alice private diary" not in refused.text
    assert await _client_count(api) == before
    # The bootstrap admin holds manage:tenant and may provision alice's agents.
    allowed = await _register(
        api,
        api.admin.headers,
        principal_id=alice.principal_id,
        kind="agent",
        scopes=["read:memory"],
    )
    assert allowed.status_code == 201, allowed.text
    created = allowed.json()
    token = await api.access_token(created["client"]["client_id"], created["client_secret"])
    reader = Agent(alice.principal_id, created["client"]["client_id"], "", token)
    page = await api.http.get("/v1/memories", headers=reader.headers)
    assert [item["value"] for item in page.json()["items"]] == ["alice private diary"]


async def test_a_narrow_admin_cannot_disable_a_wider_client(api: Api) -> None:
    """Red-team round 2, F5: disabling is capped by the caller's scopes too."""
    me, headers = await _narrow_admin(api, ["manage:policy"])
    refused = await api.http.post(f"/v1/clients/{api.admin.client_id}/disable", headers=headers)
    assert refused.status_code == 403, refused.text
    assert "manage:tenant" in refused.json()["detail"]
    still = await api.http.get("/v1/clients", headers=api.admin.headers)
    assert still.status_code == 200
    assert all(c["disabled_at"] is None for c in still.json()["items"])
    # A client within the caller's scopes can be disabled, and disabling twice keeps the time.
    peer = await api.new_client(me["id"], ["manage:policy"], kind="admin")
    peer_id = peer["client"]["client_id"]
    first = await api.http.post(f"/v1/clients/{peer_id}/disable", headers=headers)
    again = await api.http.post(f"/v1/clients/{peer_id}/disable", headers=headers)
    assert first.status_code == again.status_code == 200
    assert first.json()["disabled_at"] == again.json()["disabled_at"] is not None


async def test_a_disabled_client_can_be_enabled_again_within_the_ceiling(api: Api) -> None:
    alice = await api.new_agent("alice")
    disable = await api.http.post(
        f"/v1/clients/{alice.client_id}/disable", headers=api.admin.headers
    )
    assert disable.json()["disabled_at"] is not None
    refused = await api.token_response(alice.client_id, alice.secret)
    assert refused.status_code == 401
    enable = await api.http.post(f"/v1/clients/{alice.client_id}/enable", headers=api.admin.headers)
    assert enable.status_code == 200, enable.text
    assert enable.json()["disabled_at"] is None
    assert (await api.token_response(alice.client_id, alice.secret)).status_code == 200
    # A policy-only admin cannot revive a client that holds manage:tenant.
    _, narrow = await _narrow_admin(api, ["manage:policy"])
    owner_id = api.admin.client_id
    assert (
        await api.http.post(f"/v1/clients/{owner_id}/enable", headers=narrow)
    ).status_code == 403


async def test_a_policy_admin_cannot_revive_the_owners_stopped_client(api: Api) -> None:
    """Red-team round 3: re-enabling hands credentials back, so it takes the registration
    ceilings; before, only admin scopes on the client counted and this answered 200."""
    _, narrow = await _narrow_admin(api, ["manage:policy"])
    owners = await api.new_client(api.admin.principal_id, ["read:memory", "write:memory"])
    client_id, secret = owners["client"]["client_id"], owners["client_secret"]
    stopped = await api.http.post(f"/v1/clients/{client_id}/disable", headers=api.admin.headers)
    assert stopped.status_code == 200
    revived = await api.http.post(f"/v1/clients/{client_id}/enable", headers=narrow)
    assert revived.status_code == 422, revived.text  # it lacks the client's memory scopes
    assert (await api.token_response(client_id, secret)).status_code == 401
    listed = await api.http.get(f"/v1/clients/{client_id}", headers=api.admin.headers)
    assert listed.json()["disabled_at"] is not None
