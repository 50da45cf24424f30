"""The policy API end to end: teams, spaces, grants and sub-spaces change what every read and
write covers on the very next request; the admin API refuses what it must (no token, missing
scope, no policy grant, another tenant's ids, invalid names, chains deeper than 8)."""

from __future__ import annotations

import itertools
import json
import uuid
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.fixtures.api import Agent, Api
from tests.integration.audit.support import audit_rows
from tests.integration.memory.support import assert_problem


async def _ok(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    return response.json() if response.content else None


async def _team(api: Api, name: str = "billing") -> dict[str, Any]:
    response = await api.http.post("/v1/teams", json={"name": name}, headers=api.admin.headers)
    team: dict[str, Any] = await _ok(response, 201)
    return team


async def _space(api: Api, name: str = "billing-space", **fields: Any) -> dict[str, Any]:
    body = await _ok(
        await api.http.post("/v1/spaces", json={"name": name, **fields}, headers=api.admin.headers),
        201,
    )
    space: dict[str, Any] = body["space"]
    return space


async def _grant(api: Api, space_id: str, action: str, subject: str, method: str = "PUT") -> int:
    response = await api.http.request(
        method, f"/v1/spaces/{space_id}/grants/{action}/{subject}", headers=api.admin.headers
    )
    return int((await _ok(response))["policy_version"])


async def _member(api: Api, team_id: str, principal_id: str, method: str = "PUT") -> int:
    response = await api.http.request(
        method, f"/v1/teams/{team_id}/members/{principal_id}", headers=api.admin.headers
    )
    return int((await _ok(response))["policy_version"])


async def _ids(api: Api, agent: Agent, query: str = "invoice") -> dict[str, set[str]]:
    listed = await _ok(await api.http.get("/v1/memories", headers=agent.headers))
    # Floor off: the question is which rows search can see, not which are relevant.
    found = await _ok(await api.search(agent, query, k=50, min_score=0))
    return {
        "list": {item["id"] for item in listed["items"]},
        "search": {hit["memory"]["id"] for hit in found["hits"]},
    }


async def test_a_team_space_is_shared_exactly_with_its_members(api: Api) -> None:
    alice = await api.new_agent("alice")
    bob = await api.new_agent("bob")
    carol = await api.new_agent("carol")
    team = await _team(api)
    space = await _space(api)
    await _grant(api, space["id"], "read", team["subject"])
    await _grant(api, space["id"], "write", team["subject"])
    await _member(api, team["id"], alice.principal_id)

    shared = await api.remember(
        alice, key="invoice.policy", value="invoices go out on the 1st", space_id=space["id"]
    )
    private = await api.remember(alice, key="invoice.note", value="my own invoice note")
    assert shared["space_id"] == space["id"]
    assert (await _ids(api, alice))["list"] == {shared["id"], private["id"]}
    for outsider in (bob, carol):
        assert await _ids(api, outsider) == {"list": set(), "search": set()}
        missing = await api.http.get(f"/v1/memories/{shared['id']}", headers=outsider.headers)
        assert_problem(missing, 404, "memory-not-found")

    before = await _member(api, team["id"], bob.principal_id)  # the very next request sees it
    assert (await _ids(api, bob))["search"] == {shared["id"]}
    after = await _member(api, team["id"], bob.principal_id, method="DELETE")
    assert after == before + 1
    assert await _ids(api, bob) == {"list": set(), "search": set()}


def _subject(agent: Agent) -> str:
    return f"user:{agent.principal_id}"  # new_agent makes user principals


async def test_writing_needs_a_write_grant_and_invisible_spaces_are_404(api: Api) -> None:
    alice = await api.new_agent("alice")
    readable, hidden = await _space(api, "readable"), await _space(api, "hidden")
    await _grant(api, readable["id"], "read", _subject(alice))
    body = {"subject": "s:x", "kind": "fact", "key": "k", "value": "v"}
    read_only = await api.http.post(
        "/v1/memories", json={**body, "space_id": readable["id"]}, headers=alice.headers
    )
    assert_problem(read_only, 403, "space-read-only")
    invisible = await api.http.post(
        "/v1/memories", json={**body, "space_id": hidden["id"]}, headers=alice.headers
    )
    assert_problem(invisible, 404, "space-not-found")
    unknown_id = str(uuid.uuid4())
    unknown = await api.http.post(
        "/v1/memories", json={**body, "space_id": unknown_id}, headers=alice.headers
    )
    assert unknown.content.replace(unknown_id.encode(), b"{id}") == invisible.content.replace(
        hidden["id"].encode(), b"{id}"
    )
    assert (await api.http.get("/v1/memories", headers=alice.headers)).json()["items"] == []


async def test_a_sub_space_inherits_its_parents_grants_and_explains_why(api: Api) -> None:
    alice = await api.new_agent("alice")
    parent = await _space(api, "eng")
    child = await _space(api, "eng-infra", parent_id=parent["id"])
    team = await _team(api, "eng")
    await _member(api, team["id"], alice.principal_id)
    await _grant(api, parent["id"], "write", team["subject"])
    write_only = await api.http.post(
        "/v1/memories",
        json={"subject": "s:x", "kind": "fact", "key": "k", "value": "v", "space_id": child["id"]},
        headers=alice.headers,
    )
    assert_problem(write_only, 404, "space-not-found")  # a write grant alone writes nothing
    await _grant(api, parent["id"], "read", team["subject"])
    written = await api.remember(alice, key="k", value="in the child", space_id=child["id"])
    assert written["space_id"] == child["id"]
    explained = await _ok(
        await api.http.get(
            f"/v1/principals/{alice.principal_id}/permissions", headers=api.admin.headers
        )
    )
    reasons = {(p["space_id"], p["action"]): p["reasons"] for p in explained["permissions"]}
    [reason] = reasons[(child["id"], "write")]
    assert reason["via_subjects"] == [_subject(alice), team["subject"]]
    assert reason["via_spaces"] == [f"space:{child['id']}", f"space:{parent['id']}"]
    writers = await _ok(
        await api.http.get(f"/v1/spaces/{child['id']}/access/write", headers=api.admin.headers)
    )
    assert writers["principal_ids"] == [alice.principal_id]


async def test_a_sub_space_chain_of_nine_links_is_refused_and_changes_nothing(api: Api) -> None:
    spaces = [await _space(api, "s0")]
    for depth in range(1, 9):  # s8 is eight links below s0: the deepest allowed
        spaces.append(await _space(api, f"s{depth}", parent_id=spaces[-1]["id"]))
    listed = await _ok(await api.http.get("/v1/spaces", headers=api.admin.headers))
    version = (
        await _ok(
            await api.http.get(
                f"/v1/principals/{api.admin.principal_id}/permissions", headers=api.admin.headers
            )
        )
    )["policy_version"]
    too_deep = await api.http.post(
        "/v1/spaces", json={"name": "s9", "parent_id": spaces[-1]["id"]}, headers=api.admin.headers
    )
    assert_problem(too_deep, 422, "policy-too-deep")
    after = await _ok(await api.http.get("/v1/spaces", headers=api.admin.headers))
    assert len(after["items"]) == len(listed["items"])
    again = await _ok(
        await api.http.get(
            f"/v1/principals/{api.admin.principal_id}/permissions", headers=api.admin.headers
        )
    )
    assert again["policy_version"] == version


async def _version(api: Api) -> int:
    explained = await _ok(
        await api.http.get(
            f"/v1/principals/{api.admin.principal_id}/permissions", headers=api.admin.headers
        )
    )
    return int(explained["policy_version"])


async def test_a_team_in_a_team_shares_the_outer_teams_grants_and_explains_why(
    api: Api,
) -> None:
    alice, bob = await api.new_agent("alice"), await api.new_agent("bob")
    inner, outer = await _team(api, "inner"), await _team(api, "outer")
    space = await _space(api, "outer-space")
    await _grant(api, space["id"], "read", outer["subject"])
    await _grant(api, space["id"], "write", outer["subject"])
    await _member(api, inner["id"], alice.principal_id)
    await _member(api, outer["id"], bob.principal_id)
    await _member(api, outer["id"], inner["subject"])
    note = await api.remember(bob, key="plan", value="the outer invoice plan", space_id=space["id"])
    assert note["id"] in (await _ids(api, alice))["list"]
    explained = await _ok(
        await api.http.get(
            f"/v1/principals/{alice.principal_id}/permissions", headers=api.admin.headers
        )
    )
    reasons = {(p["space_id"], p["action"]): p["reasons"] for p in explained["permissions"]}
    [reason] = reasons[(space["id"], "read")]
    assert reason["via_subjects"] == [_subject(alice), inner["subject"], outer["subject"]]
    readers = await _ok(
        await api.http.get(f"/v1/spaces/{space['id']}/access/read", headers=api.admin.headers)
    )
    assert set(readers["principal_ids"]) == {alice.principal_id, bob.principal_id}

    await _member(api, outer["id"], inner["subject"], method="DELETE")
    assert note["id"] not in (await _ids(api, alice))["list"]
    assert note["id"] in (await _ids(api, bob))["list"]


async def test_membership_chains_of_nine_links_and_cycles_are_refused(api: Api) -> None:
    alice = await api.new_agent("alice")
    teams = [await _team(api, f"t{n}") for n in range(9)]
    await _member(api, teams[0]["id"], alice.principal_id)  # link 1
    for n in range(1, 8):  # links 2..8: t0 in t1, ..., t6 in t7
        await _member(api, teams[n]["id"], teams[n - 1]["subject"])
    version = await _version(api)
    for team, member in (
        (teams[8], teams[7]),  # the ninth link
        (teams[0], teams[3]),  # a cycle
        (teams[0], teams[0]),  # a team in itself
    ):
        refused = await api.http.put(
            f"/v1/teams/{team['id']}/members/{member['subject']}", headers=api.admin.headers
        )
        assert_problem(refused, 422, "policy-too-deep")
    assert await _version(api) == version


async def test_nesting_is_audited_with_both_teams(api: Api, owner_engine: AsyncEngine) -> None:
    """Red-team: the inner team (`team:<uuid>`, not a bare id) was missing from the audit row."""
    inner, outer = await _team(api, "inner"), await _team(api, "outer")
    await _member(api, outer["id"], inner["subject"])
    await _member(api, outer["id"], inner["subject"], method="DELETE")
    rows = [
        row
        for row in await audit_rows(owner_engine)
        if row["action"] in {"policy.team.add_member", "policy.team.remove_member"}
    ]
    assert [row["action"] for row in rows] == [
        "policy.team.add_member",
        "policy.team.remove_member",
    ]
    for row in rows:
        assert set(row["target_ids"]) == {uuid.UUID(outer["id"]), uuid.UUID(inner["id"])}


async def test_explaining_nested_teams_gives_one_chain_per_role(api: Api) -> None:
    """Red-team: eight layers of two teams, each linked to every team of the next layer, gave
    2^7 chains for one grant (and width^7 in general). Now: one shortest chain per role."""
    alice = await api.new_agent("alice")
    layers = [[await _team(api, f"l{n}a"), await _team(api, f"l{n}b")] for n in range(8)]
    for team in layers[0]:
        await _member(api, team["id"], alice.principal_id)
    for lower, upper in itertools.pairwise(layers):
        for outer in upper:
            for inner in lower:
                await _member(api, outer["id"], inner["subject"])
    space = await _space(api, "top")
    granted = layers[-1][0]
    await _grant(api, space["id"], "read", granted["subject"])
    explained = await _ok(
        await api.http.get(
            f"/v1/principals/{alice.principal_id}/permissions", headers=api.admin.headers
        )
    )
    [read] = [p for p in explained["permissions"] if p["space_id"] == space["id"]]
    [reason] = read["reasons"]
    chain = reason["via_subjects"]
    assert len(chain) == 9
    assert chain[0] == _subject(alice)
    assert chain[-1] == granted["subject"]
    assert all(
        name in {team["subject"] for team in layer}
        for name, layer in zip(chain[1:], layers, strict=True)
    )
    # Removing a link that is not there (even a team "in itself") is a no-op, not an error.
    await _member(api, granted["id"], granted["subject"], method="DELETE")


@pytest.mark.parametrize(
    ("member", "status", "slug"),
    [
        ("team:not-a-uuid", 400, "malformed-id"),
        ("team:8518b3e6-29a1-4beb-8b99-cec4dd464676", 404, "team-not-found"),  # no such team
        ("role:policy_admin", 400, "malformed-id"),
    ],
)
async def test_unknown_or_malformed_team_members_are_refused(
    api: Api, member: str, status: int, slug: str
) -> None:
    team = await _team(api)
    version = await _version(api)
    response = await api.http.put(
        f"/v1/teams/{team['id']}/members/{member}", headers=api.admin.headers
    )
    assert_problem(response, status, slug)
    assert await _version(api) == version


@pytest.mark.parametrize(
    "subject",
    [
        "user:*",
        "team:not-a-uuid",
        "space:00000000-0000-0000-0000-000000000000",
        "alice",
        "role:Admin",
        "role:x,role:y",
        "keyMatch2(a,b)",
        "user:00000000-0000-0000-0000-000000000000",
    ],
)
async def test_invalid_or_unknown_subjects_are_refused_and_change_nothing(
    api: Api, subject: str
) -> None:
    space = await _space(api)
    response = await api.http.put(
        f"/v1/spaces/{space['id']}/grants/read/{subject}", headers=api.admin.headers
    )
    assert response.status_code in {404, 422}, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    access = await _ok(
        await api.http.get(f"/v1/spaces/{space['id']}/access/read", headers=api.admin.headers)
    )
    assert access["principal_ids"] == []


async def test_another_tenants_ids_are_404(api: Api) -> None:
    other = await api.other_tenant()
    their_team, their_space = await _team(other), await _space(other)
    bob = await other.new_agent("bob")
    mine, my_team = await _space(api), await _team(api)
    cases = [
        ("PUT", f"/v1/teams/{their_team['id']}/members/{api.admin.principal_id}", "team-not-found"),
        ("PUT", f"/v1/teams/{my_team['id']}/members/{their_team['subject']}", "team-not-found"),
        ("PUT", f"/v1/teams/{my_team['id']}/members/{bob.principal_id}", "principal-not-found"),
        (
            "PUT",
            f"/v1/spaces/{their_space['id']}/grants/read/{their_team['subject']}",
            "space-unknown",
        ),
        ("PUT", f"/v1/spaces/{mine['id']}/grants/read/{their_team['subject']}", "team-not-found"),
        (
            "PUT",
            f"/v1/spaces/{mine['id']}/grants/read/user:{bob.principal_id}",
            "principal-not-found",
        ),
        ("GET", f"/v1/spaces/{their_space['id']}/access/read", "space-unknown"),
        ("GET", f"/v1/principals/{bob.principal_id}/permissions", "principal-not-found"),
    ]
    for method, path, slug in cases:
        response = await api.http.request(method, path, headers=api.admin.headers)
        assert_problem(response, 404, slug)
    parent = await api.http.post(
        "/v1/spaces", json={"name": "x", "parent_id": their_space["id"]}, headers=api.admin.headers
    )
    assert_problem(parent, 404, "space-unknown")


POLICY_ROUTES = [
    ("POST", "/v1/teams", "manage:policy"),
    ("GET", "/v1/teams", "manage:policy"),
    ("PUT", "/v1/teams/{id}/members/{id}", "manage:policy"),
    ("DELETE", "/v1/teams/{id}/members/{id}", "manage:policy"),
    ("POST", "/v1/spaces", "manage:policy"),
    ("GET", "/v1/spaces", "manage:policy"),
    ("PUT", "/v1/spaces/{id}/settings", "manage:policy"),
    ("PUT", "/v1/spaces/{id}/grants/{id}/{id}", "manage:policy"),
    ("DELETE", "/v1/spaces/{id}/grants/{id}/{id}", "manage:policy"),
    ("GET", "/v1/spaces/{id}/access/{id}", "read:policy"),
    ("GET", "/v1/principals/{id}/permissions", "read:policy"),
    ("PUT", "/v1/roles/{id}/members/{id}", "manage:policy"),
    ("DELETE", "/v1/roles/{id}/members/{id}", "manage:policy"),
    ("PUT", "/v1/principals/{id}/delegates/{id}", "manage:delegates"),
    ("DELETE", "/v1/principals/{id}/delegates/{id}", "manage:delegates"),
]
"""The policy API's routes; tests/integration/test_route_access.py leaves them to this file."""

MEMORY_ROUTES_UNDER_SPACES = {("GET", "/v1/spaces/{id}/proposals")}
"""Routes under /v1/spaces that are memory operations, not policy ones: the memory access table
(tests/integration/memory/support.py ROUTES) covers them."""


def _concrete(template: str) -> str:
    """Path parameters filled in: ids are random, an action is `read`, a subject `role:x`."""
    fillers = iter(
        [str(uuid.uuid4()), "read", "role:x"]
        if "/grants/" in template
        else ["policy_admin"]
        if template.startswith("/v1/roles")
        else []
    )
    parts = template.split("{id}")
    filled = [parts[0]]
    for i, part in enumerate(parts[1:]):
        default = "read" if "/access/" in template and i == 1 else str(uuid.uuid4())
        filled += [next(fillers, default), part]
    return "".join(filled)


@pytest.mark.parametrize(("method", "template", "scope"), POLICY_ROUTES)
async def test_no_token_missing_scope_and_no_policy_grant_are_refused(
    api: Api, method: str, template: str, scope: str
) -> None:
    path = _concrete(template)
    body = {"name": "x"} if method == "POST" else {} if template.endswith("/settings") else None
    assert_problem(await api.http.request(method, path, json=body), 401, "unauthenticated")
    alice = await api.new_agent("alice")
    refused = await api.http.request(method, path, json=body, headers=alice.headers)
    assert_problem(refused, 403, "insufficient-scope")
    if scope == "manage:policy":
        # An admin client of a principal outside role:policy_admin: the scope is not enough.
        officer = await api.new_principal("officer")
        client = await api.new_client(officer["id"], ["manage:policy"], kind="admin")
        token = await api.access_token(client["client"]["client_id"], client["client_secret"])
        headers = {"Authorization": f"Bearer {token}"}
        no_grant = await api.http.request(method, path, json=body, headers=headers)
        assert_problem(no_grant, 403, "policy-admin-required")


def test_the_policy_route_table_covers_the_policy_routes() -> None:
    import re

    from service.app import create_app

    declared = {
        (method, re.sub(r"\{\w+:str\}", "{id}", route.path).rstrip("/"))
        for route in create_app().routes
        if route.path.startswith(("/v1/teams", "/v1/spaces", "/v1/roles"))
        or route.path.endswith(("/permissions", "/delegates/{agent_id:str}"))
        for method in getattr(route, "methods", ())
        if method not in {"HEAD", "OPTIONS"}
    }
    assert declared - MEMORY_ROUTES_UNDER_SPACES == {
        (method, template) for method, template, _ in POLICY_ROUTES
    }


async def test_a_derived_memory_is_visible_only_to_readers_of_every_source(api: Api) -> None:
    alice, bob = await api.new_agent("alice"), await api.new_agent("bob")
    team, space = await _team(api), await _space(api)
    for action in ("read", "write"):
        await _grant(api, space["id"], action, team["subject"])
    for member in (alice, bob):
        await _member(api, team["id"], member.principal_id)
    note = await api.remember(alice, key="invoice.private", value="alice's private invoice note")
    fact = await api.remember(
        alice, key="invoice.team", value="team invoice fact", space_id=space["id"]
    )
    summary = await api.remember(
        alice,
        key="invoice.summary",
        value="invoice summary drawn from a private note",
        space_id=space["id"],
        derived_from=[note["id"], fact["id"]],
    )
    assert summary["provenance"]["derived_from"] == [note["id"], fact["id"]]
    assert (await _ids(api, alice))["list"] >= {note["id"], fact["id"], summary["id"]}
    seen_by_bob = await _ids(api, bob)
    assert seen_by_bob["list"] == {fact["id"]}
    assert summary["id"] not in seen_by_bob["search"]
    hidden = await api.http.get(f"/v1/memories/{summary['id']}", headers=bob.headers)
    assert_problem(hidden, 404, "memory-not-found")
    # Deriving from what you cannot read is refused like a missing id, and writes nothing.
    refused = await api.http.post(
        "/v1/memories",
        json={
            "subject": "s:x",
            "kind": "summary",
            "key": "k",
            "value": "v",
            "space_id": space["id"],
            "derived_from": [note["id"]],
        },
        headers=bob.headers,
    )
    assert_problem(refused, 404, "memory-not-found")
    assert note["id"] in refused.json()["detail"]
    assert (await _ids(api, bob))["list"] == {fact["id"]}


async def test_the_policy_admin_role_is_granted_and_taken_through_the_api(api: Api) -> None:
    officer = await api.new_principal("officer")
    client = await api.new_client(officer["id"], ["manage:policy"], kind="admin")
    token = await api.access_token(client["client"]["client_id"], client["client_secret"])
    headers = {"Authorization": f"Bearer {token}"}
    # manage:policy alone manages nothing: not principals, not teams
    assert_problem(
        await api.http.get("/v1/principals", headers=headers), 403, "policy-admin-required"
    )
    role = f"/v1/roles/policy_admin/members/{officer['id']}"
    granted = await api.http.put(role, headers=api.admin.headers)
    assert granted.status_code == 200, granted.text
    assert (await api.http.get("/v1/principals", headers=headers)).status_code == 200
    assert (
        await api.http.post("/v1/teams", json={"name": "x"}, headers=headers)
    ).status_code == 201
    own = await api.http.delete(f"/v1/roles/policy_admin/members/{officer['id']}", headers=headers)
    assert_problem(own, 422, "policy-name-invalid")
    taken = await api.http.delete(role, headers=api.admin.headers)
    assert taken.status_code == 200
    assert_problem(
        await api.http.get("/v1/principals", headers=headers), 403, "policy-admin-required"
    )
    unknown_role = await api.http.put(
        f"/v1/roles/root/members/{officer['id']}", headers=api.admin.headers
    )
    assert unknown_role.status_code in {400, 422}


async def test_a_reader_of_every_source_may_supersede_and_delete_a_derived_memory(
    api: Api,
) -> None:
    """Writes and deletes check `read_requires` against what the caller reads, not against its
    write or delete grants (red-team: such a reader got 500 writing, 404 deleting)."""
    alice, carol = await api.new_agent("alice"), await api.new_agent("carol")
    space, sources = await _space(api), await _space(api, "sources")
    for action in ("read", "write", "delete"):
        await _grant(api, space["id"], action, _subject(alice))
        await _grant(api, space["id"], action, _subject(carol))
    for action in ("read", "write"):
        await _grant(api, sources["id"], action, _subject(alice))
    await _grant(api, sources["id"], "read", _subject(carol))  # carol reads the sources only
    note = await api.remember(alice, key="n", value="alice's note", space_id=sources["id"])
    summary = await api.remember(
        alice, key="s", value="summary v1", space_id=space["id"], derived_from=[note["id"]]
    )
    newer = await api.remember(
        carol, key="s", value="summary v2", space_id=space["id"], derived_from=[note["id"]]
    )
    assert newer["version"] == 2
    assert newer["supersedes"] == summary["id"]
    gone = await api.http.delete(f"/v1/memories/{newer['id']}", headers=carol.headers)
    assert gone.status_code == 204, gone.text


async def test_a_hidden_derived_version_is_neither_run_into_nor_superseded(api: Api) -> None:
    """Same subject, kind and key in one space, different audiences: separate chains. A writer
    who cannot see the derived row neither collides with it (it used to get a 500 that told it
    the row existed) nor has its own fact closed by it."""
    alice, bob = await api.new_agent("alice"), await api.new_agent("bob")
    space = await _space(api)
    for who in (alice, bob):
        for action in ("read", "write"):
            await _grant(api, space["id"], action, _subject(who))
    fact = await api.remember(bob, key="plan", value="bob's team fact", space_id=space["id"])
    note = await api.remember(alice, key="n", value="alice's private note")
    summary = await api.remember(
        alice, key="plan", value="derived plan", space_id=space["id"], derived_from=[note["id"]]
    )
    assert summary["version"] == 1
    assert summary["supersedes"] is None
    still = await _ok(await api.http.get(f"/v1/memories/{fact['id']}", headers=bob.headers))
    assert still["status"] == "live"
    again = await api.remember(bob, key="plan", value="bob's second fact", space_id=space["id"])
    assert again["supersedes"] == fact["id"]
    assert summary["id"] not in json.dumps(again)


async def test_personal_spaces_are_their_owners_alone(api: Api) -> None:
    alice, mallory = await api.new_agent("alice"), await api.new_agent("mallory")
    alice_row = await _ok(
        await api.http.get(f"/v1/principals/{alice.principal_id}", headers=api.admin.headers)
    )
    personal = alice_row["personal_space_id"]
    for method, action, subject in (
        ("PUT", "read", _subject(mallory)),
        ("DELETE", "read", _subject(alice)),
    ):
        response = await api.http.request(
            method, f"/v1/spaces/{personal}/grants/{action}/{subject}", headers=api.admin.headers
        )
        assert_problem(response, 422, "personal-space")
    nested = await api.http.post(
        "/v1/spaces", json={"name": "under", "parent_id": personal}, headers=api.admin.headers
    )
    assert_problem(nested, 422, "personal-space")
    note = await api.remember(alice, key="k", value="alice only")
    hidden = await api.http.get(f"/v1/memories/{note['id']}", headers=mallory.headers)
    assert_problem(hidden, 404, "memory-not-found")
