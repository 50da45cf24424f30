"""Principals and clients: tenant-scoped, secrets shown once, admin scopes never for agents,
disabling a client stops its tokens at once."""

from __future__ import annotations

from typing import Any

from tests.fixtures.api import MEMORY_SCOPES, Api
from tests.integration.memory.support import assert_problem, random_id, scalar


async def _clients(api: Api) -> int:
    count: int = await scalar(api.runtime, "SELECT count(*) FROM clients")
    return count


async def _principals(api: Api) -> int:
    count: int = await scalar(api.runtime, "SELECT count(*) FROM principals")
    return count


async def test_principal_gets_a_personal_space(api: Api) -> None:
    created = await api.new_principal("alice", kind="agent")
    assert created["kind"] == "agent"
    assert created["display_name"] == "alice"
    assert created["personal_space_id"] is not None
    assert created["disabled_at"] is None
    response = await api.http.get(f"/v1/principals/{created['id']}", headers=api.admin.headers)
    assert response.status_code == 200
    assert response.json() == created
    space = await scalar(
        api.runtime,
        "SELECT count(*) FROM spaces WHERE id = :id AND owner_id = :owner AND kind = 'personal'",
        id=created["personal_space_id"],
        owner=created["id"],
    )
    assert space == 1


async def test_lists_show_only_the_callers_tenant(api: Api) -> None:
    alice = await api.new_agent("alice")
    other = await api.other_tenant()
    mallory = await other.new_agent("mallory")

    principals = await api.http.get("/v1/principals", headers=api.admin.headers)
    assert principals.status_code == 200
    assert [p["id"] for p in principals.json()["items"]] == [
        api.admin.principal_id,
        alice.principal_id,
    ]
    clients = await api.http.get("/v1/clients", headers=api.admin.headers)
    assert {c["client_id"] for c in clients.json()["items"]} == {
        api.admin.client_id,
        alice.client_id,
    }
    for text in (principals.text, clients.text):
        assert mallory.principal_id not in text
        assert mallory.client_id not in text
        assert other.admin.principal_id not in text
        assert "mgs_" not in text
        assert "secret" not in text


async def test_client_secret_is_shown_once_and_works(api: Api) -> None:
    principal = await api.new_principal("alice")
    created = await api.new_client(principal["id"], ["read:memory", "write:memory"])
    secret = created["client_secret"]
    client = created["client"]
    assert secret.startswith("mgs_")
    assert len(secret) > 40
    assert client["scopes"] == ["read:memory", "write:memory"]
    assert client["kind"] == "agent"
    fetched = await api.http.get(f"/v1/clients/{client['client_id']}", headers=api.admin.headers)
    assert fetched.json() == client
    assert secret not in fetched.text
    stored = await scalar(
        api.runtime,
        "SELECT secret_hash FROM clients WHERE client_id = :id",
        id=client["client_id"],
    )
    assert secret not in stored
    assert stored.startswith("$argon2id$")
    token = await api.token_response(client["client_id"], secret)
    assert token.status_code == 200
    assert sorted(token.json()["scope"].split()) == ["read:memory", "write:memory"]


async def test_agents_never_get_admin_scopes(api: Api) -> None:
    principal = await api.new_principal("alice", kind="agent")
    before = await _clients(api)
    for scopes in (["manage:policy"], ["read:memory", "manage:policy"], ["read:audit"]):
        response = await api.http.post(
            "/v1/clients",
            json={
                "principal_id": principal["id"],
                "name": "bad",
                "kind": "agent",
                "scopes": scopes,
            },
            headers=api.admin.headers,
        )
        problem = assert_problem(response, 422, "scope-not-allowed")
        assert scopes[-1] in problem["detail"]
    unknown = await api.http.post(
        "/v1/clients",
        json={"principal_id": principal["id"], "name": "bad", "scopes": ["write:everything"]},
        headers=api.admin.headers,
    )
    assert "write:everything" in assert_problem(unknown, 422, "scope-not-allowed")["detail"]
    assert await _clients(api) == before


async def test_client_for_another_tenants_principal_is_404(api: Api) -> None:
    other = await api.other_tenant()
    theirs = await other.new_principal("mallory")
    before = await _clients(api)
    for principal_id in (theirs["id"], random_id()):
        response = await api.http.post(
            "/v1/clients",
            json={"principal_id": principal_id, "name": "x", "scopes": list(MEMORY_SCOPES)},
            headers=api.admin.headers,
        )
        problem = assert_problem(response, 404, "principal-not-found")
        assert principal_id in problem["detail"]
    assert await _clients(api) == before


async def test_disabling_a_client_stops_its_live_tokens(api: Api) -> None:
    alice = await api.new_agent("alice")
    memory = await api.remember(alice, key="deploy.window", value="friday")
    response = await api.http.post(
        f"/v1/clients/{alice.client_id}/disable", headers=api.admin.headers
    )
    assert response.status_code == 200
    assert response.json()["disabled_at"] is not None

    refused = await api.http.get(f"/v1/memories/{memory['id']}", headers=alice.headers)
    problem = assert_problem(refused, 401, "unauthenticated")
    assert 'error="invalid_token"' in refused.headers["www-authenticate"]
    assert memory["value"] not in refused.text
    assert "friday" not in problem["detail"]
    token = await api.token_response(alice.client_id, alice.secret)
    assert token.status_code in {400, 401}, token.text
    assert "access_token" not in token.json()
    # The data is still there: another client of the same principal reads it.
    second = await api.new_client(alice.principal_id)
    token_value = await api.access_token(second["client"]["client_id"], second["client_secret"])
    again = await api.http.get(
        f"/v1/memories/{memory['id']}", headers={"Authorization": f"Bearer {token_value}"}
    )
    assert again.status_code == 200
    assert again.json()["value"] == "friday"


async def test_external_subject_is_unique_per_issuer(api: Api) -> None:
    fields: dict[str, Any] = {"external_issuer": "https://idp.example", "external_subject": "u-1"}
    first = await api.new_principal("alice", **fields)
    assert first["external_subject"] == "u-1"
    before = await _principals(api)
    response = await api.http.post(
        "/v1/principals", json={"display_name": "impostor", **fields}, headers=api.admin.headers
    )
    assert_problem(response, 409, "external-subject-taken")
    assert await _principals(api) == before
    # Another tenant may map the same external subject to its own principal.
    other = await api.other_tenant()
    assert (await other.new_principal("alice", **fields))["id"] != first["id"]


async def test_malformed_and_bad_admin_bodies(api: Api) -> None:
    before = (await _principals(api), await _clients(api))
    for path in ("/v1/principals/nope", "/v1/clients/nope", "/v1/clients/nope/disable"):
        method = "POST" if path.endswith("disable") else "GET"
        response = await api.http.request(method, path, headers=api.admin.headers)
        assert_problem(response, 400, "malformed-id")
    cases: list[tuple[str, dict[str, Any], str]] = [
        ("/v1/principals", {"display_name": ""}, "display_name"),
        ("/v1/principals", {"display_name": "x", "kind": "robot"}, "kind"),
        ("/v1/principals", {"display_name": 7}, "display_name"),
        ("/v1/principals", {"display_name": "x", "role": "admin"}, "role"),
        ("/v1/clients", {"principal_id": random_id(), "name": "x", "scopes": []}, "scopes"),
    ]
    for path, body, mentioned in cases:
        response = await api.http.post(path, json=body, headers=api.admin.headers)
        problem = assert_problem(response, 422, "invalid-request")
        assert mentioned in problem["detail"], problem
    # A malformed id in a body is 400 malformed-id, as in a path (review item 22).
    response = await api.http.post(
        "/v1/clients",
        json={"principal_id": "nope", "name": "x", "scopes": ["read:memory"]},
        headers=api.admin.headers,
    )
    assert "principal_id" in assert_problem(response, 400, "malformed-id")["detail"]
    assert (await _principals(api), await _clients(api)) == before


async def test_the_answer_holding_a_secret_is_not_cached(api: Api) -> None:
    principal = await api.new_principal("alice")
    response = await api.http.post(
        "/v1/clients",
        json={"principal_id": principal["id"], "name": "a", "scopes": ["read:memory"]},
        headers=api.admin.headers,
    )
    assert response.status_code == 201
    assert response.json()["client_secret"].startswith("mgs_")
    assert response.headers["cache-control"] == "no-store"
