"""RFC 8693 token exchange: an agent acts for a user who allowed it, sees only what both may
see, cannot delegate again, and stops the moment the user withdraws consent."""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

import httpx
from sqlalchemy import text

from service.auth.exchange import ACCESS_TOKEN_TYPE, TOKEN_EXCHANGE
from tests.fixtures.api import MEMORY_SCOPES, Agent, Api
from tests.fixtures.entrance import bypasses_visible
from tests.integration.auth.forge import (
    assert_token_rejected,
    claims_for,
    embedded_key,
    get_protected,
    sign,
)
from tests.integration.memory.support import as_owner, assert_problem


def _claims(token: str) -> dict[str, Any]:
    payload = token.split(".")[1]
    decoded: dict[str, Any] = json.loads(base64.urlsafe_b64decode(payload + "=" * 4))
    return decoded


async def _exchange(api: Api, agent: Agent, subject_token: str, **extra: str) -> httpx.Response:
    form = {
        "grant_type": TOKEN_EXCHANGE,
        "subject_token": subject_token,
        "subject_token_type": ACCESS_TOKEN_TYPE,
        **extra,
    }
    response: httpx.Response = await api.http.post(
        "/oauth/token", data=form, auth=(agent.client_id, agent.secret)
    )
    return response


async def _world(api: Api) -> dict[str, Any]:
    # A user principal with its own client, allowed to decide who acts for it.
    user = await api.new_agent("ursula", scopes=(*MEMORY_SCOPES, "manage:delegates"))
    agent_principal = await api.new_principal("helper-bot", kind="agent")
    created = await api.new_client(agent_principal["id"], ["read:memory", "write:memory"])
    token = await api.access_token(created["client"]["client_id"], created["client_secret"])
    agent = Agent(
        agent_principal["id"], created["client"]["client_id"], created["client_secret"], token
    )
    admin = api.admin.headers
    space = (await api.http.post("/v1/spaces", json={"name": "shared"}, headers=admin)).json()
    space_id = space["space"]["id"]
    for action in ("read", "write"):
        await api.http.put(
            f"/v1/spaces/{space_id}/grants/{action}/user:{user.principal_id}", headers=admin
        )
    await api.http.put(
        f"/v1/spaces/{space_id}/grants/read/agent:{agent.principal_id}", headers=admin
    )
    private = await api.remember(user, key="u.private", value="ursula's private note")
    shared = await api.remember(user, key="u.shared", value="shared note", space_id=space_id)
    own = await api.remember(agent, key="a.own", value="the agent's own note")
    return {
        "user": user,
        "agent": agent,
        "space_id": space_id,
        "private": private,
        "shared": shared,
        "own": own,
    }


async def test_without_consent_the_exchange_is_refused(api: Api) -> None:
    world = await _world(api)
    refused = await _exchange(api, world["agent"], world["user"].token)
    assert refused.status_code == 400, refused.text
    assert "not allowed this agent" in refused.text


async def test_a_delegated_token_sees_what_both_may_see_and_nothing_else(api: Api) -> None:
    world = await _world(api)
    user, agent = world["user"], world["agent"]
    allowed = await api.http.put(
        f"/v1/principals/{user.principal_id}/delegates/{agent.principal_id}", headers=user.headers
    )
    assert allowed.status_code == 204, allowed.text
    answer = await _exchange(api, agent, user.token, scope="read:memory write:memory manage:policy")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    claims = _claims(body["access_token"])
    assert claims["sub"] == user.principal_id
    assert claims["act"] == {"sub": agent.principal_id}
    assert claims["client_id"] == agent.client_id
    assert body["scope"] == "read:memory write:memory"
    assert claims["exp"] <= _claims(user.token)["exp"]
    headers = {"Authorization": f"Bearer {body['access_token']}"}

    listed = await api.http.get("/v1/memories", headers=headers)
    assert {item["id"] for item in listed.json()["items"]} == {world["shared"]["id"]}
    counted = await api.http.get(
        "/v1/memories/counts", params={"group_by": "space"}, headers=headers
    )
    assert counted.json()["total"] == 1
    assert counted.json()["groups"] == [{"value": world["space_id"], "count": 1}]
    for hidden in ("private", "own"):
        got = await api.http.get(f"/v1/memories/{world[hidden]['id']}", headers=headers)
        assert_problem(got, 404, "memory-not-found")
    # The user may write in the shared space, the agent may not: neither may the pair.
    write = await api.http.post(
        "/v1/memories",
        json={
            "subject": "s:x",
            "kind": "fact",
            "key": "k",
            "value": "v",
            "space_id": world["space_id"],
        },
        headers=headers,
    )
    assert write.status_code in {403, 404}, write.text

    # Row-level security alone agrees: the pair's settings show the shared note only.
    with bypasses_visible("row-level security alone, without Visible"):
        async with api.runtime.engine.begin() as conn:
            await conn.execute(
                text(
                    "SELECT set_config('memgate.tenant_id', :t, true), "
                    "set_config('memgate.principal_id', :p, true), "
                    "set_config('memgate.actor_id', :a, true)"
                ),
                {"t": api.tenant_id, "p": user.principal_id, "a": agent.principal_id},
            )
            seen = (await conn.execute(text("SELECT id FROM memories"))).scalars().all()
    assert {str(i) for i in seen} == {world["shared"]["id"]}

    # The audit row names the user as actor and the agent in the delegation chain.
    async with as_owner(api.runtime) as conn:
        row = (
            await conn.execute(
                text(
                    "SELECT actor, delegation, client_id FROM audit_events "
                    "WHERE action = 'memory.list' ORDER BY at DESC LIMIT 1"
                )
            )
        ).one()
    assert len(row.delegation) == 1
    assert row.delegation[0] != row.actor
    assert row.client_id == agent.client_id


async def test_no_nested_delegation_and_consent_withdrawal_bites_at_once(api: Api) -> None:
    world = await _world(api)
    user, agent = world["user"], world["agent"]
    await api.http.put(
        f"/v1/principals/{user.principal_id}/delegates/{agent.principal_id}", headers=user.headers
    )
    delegated = (await _exchange(api, agent, user.token)).json()["access_token"]
    nested = await _exchange(api, agent, delegated)
    assert nested.status_code == 400
    assert "cannot be delegated again" in nested.text
    headers = {"Authorization": f"Bearer {delegated}"}
    assert (await api.http.get("/v1/memories", headers=headers)).status_code == 200
    withdrawn = await api.http.delete(
        f"/v1/principals/{user.principal_id}/delegates/{agent.principal_id}", headers=user.headers
    )
    assert withdrawn.status_code == 204
    after = await api.http.get("/v1/memories", headers=headers)
    assert_problem(after, 401, "unauthenticated")


async def test_only_the_user_or_a_policy_admin_decides_and_agents_only(api: Api) -> None:
    world = await _world(api)
    user, agent = world["user"], world["agent"]
    other = await api.new_agent("mallory")
    path = f"/v1/principals/{user.principal_id}/delegates/{agent.principal_id}"
    assert_problem(await api.http.put(path, headers=other.headers), 403, "insufficient-scope")
    assert (await api.http.put(path, headers=api.admin.headers)).status_code == 204
    as_user = f"/v1/principals/{user.principal_id}/delegates/{other.principal_id}"
    refused = await api.http.put(as_user, headers=user.headers)  # mallory is a user, not an agent
    assert refused.status_code == 422, refused.text
    foreign = await api.other_tenant()
    bot = await foreign.new_principal("bot", kind="agent")
    missing = await api.http.put(
        f"/v1/principals/{user.principal_id}/delegates/{bot['id']}", headers=user.headers
    )
    assert_problem(missing, 404, "principal-not-found")
    assert str(uuid.UUID(bot["id"])) in missing.text


async def test_changing_delegates_needs_the_manage_delegates_scope(api: Api) -> None:
    """Review item 10: a `read:memory`-only token of the user changed who may act for it."""
    world = await _world(api)
    user, agent = world["user"], world["agent"]
    narrow = await api.access_token(user.client_id, user.secret, "read:memory")
    headers = {"Authorization": f"Bearer {narrow}"}
    path = f"/v1/principals/{user.principal_id}/delegates/{agent.principal_id}"
    refused = await api.http.put(path, headers=headers)
    body = assert_problem(refused, 403, "insufficient-scope")
    assert body["required_scope"] == "manage:delegates"
    # Nothing changed: the agent still cannot act for the user.
    still_refused = await _exchange(api, agent, user.token)
    assert still_refused.status_code == 400, still_refused.text
    assert (await api.http.put(path, headers=user.headers)).status_code == 204
    assert (await _exchange(api, agent, user.token)).status_code == 200
    assert_problem(await api.http.delete(path, headers=headers), 403, "insufficient-scope")
    assert (await _exchange(api, agent, user.token)).status_code == 200


async def test_disabling_the_users_client_stops_its_delegated_tokens(api: Api) -> None:
    """Review item 11: the delegated token came from the user's token, so disabling the client
    that token was issued to stops the delegated token at once too, not at its `exp`."""
    world = await _world(api)
    user, agent = world["user"], world["agent"]
    await api.http.put(
        f"/v1/principals/{user.principal_id}/delegates/{agent.principal_id}", headers=user.headers
    )
    delegated = (await _exchange(api, agent, user.token)).json()["access_token"]
    assert _claims(delegated)["subject_client_id"] == user.client_id
    headers = {"Authorization": f"Bearer {delegated}"}
    listed = await api.http.get("/v1/memories", headers=headers)
    assert listed.status_code == 200
    assert world["shared"]["id"] in {m["id"] for m in listed.json()["items"]}

    disabled = await api.http.post(
        f"/v1/clients/{user.client_id}/disable", headers=api.admin.headers
    )
    assert disabled.status_code == 200
    after = await api.http.get("/v1/memories", headers=headers)
    assert_problem(after, 401, "unauthenticated")
    assert world["shared"]["id"] not in after.text
    # The agent's own token is not the user's client: it keeps working.
    own = await api.http.get("/v1/memories", headers=agent.headers)
    assert own.status_code == 200
    assert world["own"]["id"] in {m["id"] for m in own.json()["items"]}

    enabled = await api.http.post(f"/v1/clients/{user.client_id}/enable", headers=api.admin.headers)
    assert enabled.status_code == 200
    assert (await api.http.get("/v1/memories", headers=headers)).status_code == 200


async def test_a_delegated_token_must_name_the_users_client(api: Api) -> None:
    """Signed by us but not saying where the user's authority came from (or naming a client
    the user does not hold): refused, so the user's client check cannot be skipped."""
    world = await _world(api)
    user, agent = world["user"], world["agent"]
    await api.http.put(
        f"/v1/principals/{user.principal_id}/delegates/{agent.principal_id}", headers=user.headers
    )
    key = await embedded_key(api.runtime)
    delegation = {"act": {"sub": agent.principal_id}, "client_id": agent.client_id}
    issuer = api.runtime.settings.server.public_url
    good = sign(
        key,
        claims_for(
            api.runtime,
            user,
            api.tenant_id,
            **delegation,
            subject_issuer=issuer,
            subject_client_id=user.client_id,
        ),
    )
    assert (await get_protected(api.http, good)).status_code == 200
    for extra in (
        {},
        {"subject_issuer": issuer},
        {"subject_issuer": issuer, "subject_client_id": agent.client_id},
        {"subject_issuer": issuer, "subject_client_id": "not-a-uuid"},
    ):
        token = sign(key, claims_for(api.runtime, user, api.tenant_id, **delegation, **extra))
        assert_token_rejected(await get_protected(api.http, token), token)
