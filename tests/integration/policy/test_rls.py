"""Row-level security alone, without Visible: statements with no predicate at all, run as the
app role, see and touch exactly what the caller named in the transaction's settings may, and
nothing when nobody is named."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from tests.fixtures.api import Agent, Api

pytestmark = pytest.mark.bypasses_visible("row-level security alone, without Visible")

_NAME = (
    "SELECT set_config('memgate.tenant_id', :tenant, true), "
    "set_config('memgate.principal_id', :principal, true)"
)


async def _unfiltered(api: Api, tenant: str | None, principal: str | None, sql: str) -> Any:
    """`sql` as the app role with no predicate of ours, as `principal` (or as nobody)."""
    async with api.runtime.engine.begin() as conn:
        if tenant is not None and principal is not None:
            await conn.execute(text(_NAME), {"tenant": tenant, "principal": principal})
        result = await conn.execute(text(sql))
        return result.scalars().all() if result.returns_rows else result.rowcount


async def _api_ids(api: Api, agent: Agent) -> set[str]:
    listed = await api.http.get("/v1/memories", headers=agent.headers, params={"limit": 100})
    return {item["id"] for item in listed.json()["items"]}


async def _setup(api: Api) -> dict[str, Any]:
    alice, bob = await api.new_agent("alice"), await api.new_agent("bob")
    admin = api.admin.headers
    team = (await api.http.post("/v1/teams", json={"name": "t"}, headers=admin)).json()
    space = (await api.http.post("/v1/spaces", json={"name": "s"}, headers=admin)).json()["space"]
    for action in ("read", "write"):
        await api.http.put(
            f"/v1/spaces/{space['id']}/grants/{action}/{team['subject']}", headers=admin
        )
    await api.http.put(f"/v1/teams/{team['id']}/members/{alice.principal_id}", headers=admin)
    alice_note = await api.remember(alice, key="a.note", value="alice private")
    team_fact = await api.remember(alice, key="t.fact", value="team", space_id=space["id"])
    derived = await api.remember(
        alice,
        key="t.summary",
        value="summary of a private note",
        space_id=space["id"],
        derived_from=[alice_note["id"]],
    )
    bob_note = await api.remember(bob, key="b.note", value="bob private")
    other = await api.other_tenant()
    carol = await other.new_agent("carol")
    carol_note = await other.remember(carol, key="c.note", value="carol private")
    return {
        "alice": alice,
        "bob": bob,
        "space": space,
        "ids": {
            "alice_note": alice_note["id"],
            "team_fact": team_fact["id"],
            "derived": derived["id"],
            "bob_note": bob_note["id"],
            "carol_note": carol_note["id"],
        },
        "carol": carol,
        "other": other,
    }


async def test_rls_alone_shows_each_caller_exactly_what_visible_does(api: Api) -> None:
    world = await _setup(api)
    ids = world["ids"]
    alice, bob = world["alice"], world["bob"]
    expected = {
        alice.principal_id: {ids["alice_note"], ids["team_fact"], ids["derived"]},
        bob.principal_id: {ids["bob_note"]},
    }
    for agent in (alice, bob):
        seen = await _unfiltered(api, api.tenant_id, agent.principal_id, "SELECT id FROM memories")
        assert {str(i) for i in seen} == expected[agent.principal_id]
        assert await _api_ids(api, agent) == expected[agent.principal_id]
    # Nobody named, or a principal under the wrong tenant: nothing.
    assert await _unfiltered(api, None, None, "SELECT id FROM memories") == []
    carol = world["carol"]
    assert (
        await _unfiltered(api, api.tenant_id, carol.principal_id, "SELECT id FROM memories") == []
    )
    assert (
        await _unfiltered(
            api, world["other"].tenant_id, alice.principal_id, "SELECT id FROM memories"
        )
        == []
    )


@pytest.mark.parametrize(
    ("sql", "who"),
    [
        ("UPDATE memories SET value = 'x'", "alice"),
        ("DELETE FROM memories", "alice"),
        ("UPDATE memories SET value = 'x'", None),
        ("DELETE FROM memories", None),
    ],
)
async def test_rls_alone_lets_no_one_change_what_they_may_not(
    api: Api, sql: str, who: str | None
) -> None:
    world = await _setup(api)
    principal = world[who].principal_id if who else None
    tenant = api.tenant_id if who else None
    await _unfiltered(api, tenant, principal, sql)
    for agent in (world["bob"],):
        assert world["ids"]["bob_note"] in await _api_ids(api, agent)
    bob_value = await _unfiltered(
        api,
        api.tenant_id,
        world["bob"].principal_id,
        f"SELECT value FROM memories WHERE id = '{world['ids']['bob_note']}'",
    )
    assert bob_value == ["bob private"]


async def test_rls_alone_refuses_an_insert_into_a_space_without_write(api: Api) -> None:
    world = await _setup(api)
    bob = world["bob"]
    row = (
        "INSERT INTO memories (tenant_id, id, space_id, owner_id, writer_id, client_id, subject, "
        "kind, key, value, content_hash, embedding_model, valid_from, recorded_at, version) "
        f"VALUES ('{api.tenant_id}', '{uuid.uuid4()}', '{world['space']['id']}', "
        f"'{bob.principal_id}', '{bob.principal_id}', 'c', 's:x', 'fact', 'k', 'v', 'h', 'm', "
        "now(), now(), 1)"
    )
    with pytest.raises(DBAPIError, match="row-level security"):
        await _unfiltered(api, api.tenant_id, bob.principal_id, row)


async def test_rls_alone_keeps_write_and_delete_only_grants_off_unreadable_rows(api: Api) -> None:
    """An UPDATE or DELETE naming no column is checked by its own policy only: those policies
    demand read too (red-team: a write-only grant overwrote, a delete-only grant deleted)."""
    world = await _setup(api)
    mallory = await api.new_agent("mallory")
    space_id = world["space"]["id"]
    for action in ("write", "delete"):
        granted = await api.http.put(
            f"/v1/spaces/{space_id}/grants/{action}/user:{mallory.principal_id}",
            headers=api.admin.headers,
        )
        assert granted.status_code == 200, granted.text
    for sql in ("UPDATE memories SET value = 'pwned'", "DELETE FROM memories"):
        assert await _unfiltered(api, api.tenant_id, mallory.principal_id, sql) == 0
    # bob reads and writes the team space but not alice's private space: the summary derived
    # from her note is out of his reach, for DELETE too.
    team_reader = world["bob"]
    for action in ("read", "write", "delete"):
        await api.http.put(
            f"/v1/spaces/{space_id}/grants/{action}/user:{team_reader.principal_id}",
            headers=api.admin.headers,
        )
    deleted = await _unfiltered(
        api,
        api.tenant_id,
        team_reader.principal_id,
        "DELETE FROM memories WHERE value LIKE 'summary%'",
    )
    assert deleted == 0
    alice = world["alice"]
    still = await _unfiltered(
        api, api.tenant_id, alice.principal_id, "SELECT value FROM memories ORDER BY value"
    )
    assert "summary of a private note" in still
    assert "team" in still
