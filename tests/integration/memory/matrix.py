"""The per-route access matrix (no token, missing scope, another tenant's id, minimal scope), run
against real tokens. tests/integration/memory and tests/integration/identity parametrize it over
their part of `support.ROUTES`."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from service.audit.checkpoints import run_checkpoints
from service.auth.scopes import ADMIN_SCOPES
from tests.fixtures.api import MEMORY_SCOPES, Agent, Api
from tests.integration.memory.support import (
    ROUTES,
    Route,
    Targets,
    assert_problem,
    call,
    count_memories,
    issuer_body,
    problem_uri,
    random_id,
    scalar,
    target_id,
)

ADMIN_ONLY = "manage:policy"
[ROUTE_REVOKE] = [route for route in ROUTES if str(route) == "POST /v1/memories/{id}/revoke"]


REVIEW = "review:memory"


def _agent_scopes(route: Route) -> tuple[str, ...]:
    """An agent's registered scopes: the memory ones, and `review:memory` for a review route."""
    return (*MEMORY_SCOPES, REVIEW) if route.scope == REVIEW else MEMORY_SCOPES


async def check_unauthenticated(http: Any, route: Route) -> None:
    """No token, a non-bearer scheme, an empty bearer and a forged token: 401 with a challenge,
    whatever the body or id."""
    body = route.body(Targets(random_id(), random_id(), random_id())) if route.body else None
    resource_id = random_id()
    cases: list[tuple[dict[str, str], str | None]] = [
        ({}, None),
        ({"Authorization": "Basic dXNlcjpwYXNz"}, None),
        ({"Authorization": "Bearer "}, None),
        ({"Authorization": "Bearer not.a.jwt"}, "invalid_token"),
    ]
    for headers, error in cases:
        response = await call(http, route, resource_id, headers, body)
        problem = assert_problem(response, 401, "unauthenticated")
        challenge = response.headers.get("www-authenticate", "")
        assert challenge.startswith("Bearer "), (headers, challenge)
        assert 'realm="memgate"' in challenge
        if error is not None:
            assert f'error="{error}"' in challenge
        assert "not.a.jwt" not in response.text
        assert set(problem) <= {"type", "title", "status", "detail", "instance"}


async def _own_targets(api: Api, agent: Agent) -> Targets:
    memory = await api.remember(agent, key="matrix.own", value="the caller's own memory")
    # Another `iss` than the routes' own body: a tenant registers an issuer once.
    body = issuer_body(Targets("", "", "")) | {"issuer": "https://login.targets.matrix.test"}
    issuer = await api.http.post("/v1/issuers", json=body, headers=api.admin.headers)
    assert issuer.status_code == 201, issuer.text
    return Targets(
        memory["id"],
        agent.principal_id,
        agent.client_id,
        issuer.json()["id"],
        space_id=memory["space_id"],
    )


async def _state(api: Api, targets: Targets) -> tuple[Any, ...]:
    """Everything a refused call could have changed."""
    runtime = api.runtime
    return (
        await count_memories(runtime),
        await scalar(runtime, "SELECT count(*) FROM principals"),
        await scalar(runtime, "SELECT count(*) FROM clients"),
        await scalar(runtime, "SELECT count(*) FROM clients WHERE disabled_at IS NOT NULL"),
        await scalar(runtime, "SELECT count(*) FROM tenant_issuers"),
        await scalar(runtime, "SELECT count(*) FROM memories WHERE id = :id", id=targets.memory_id),
    )


def _assert_insufficient(response: Any, scope: str) -> None:
    problem = assert_problem(response, 403, "insufficient-scope")
    assert problem["required_scope"] == scope
    assert scope in problem["detail"]
    challenge = response.headers["www-authenticate"]
    assert 'error="insufficient_scope"' in challenge
    assert f'scope="{scope}"' in challenge


async def check_insufficient_scope(api: Api, route: Route) -> None:
    """Tokens that hold everything but the route's scope: 403 naming it, and nothing changes."""
    alice = await api.new_agent("alice", scopes=_agent_scopes(route))
    targets = await _own_targets(api, alice)
    body = route.body(targets) if route.body else None
    tokens: list[str] = []
    if route.scope in (*MEMORY_SCOPES, REVIEW):
        others = " ".join(scope for scope in MEMORY_SCOPES if scope != route.scope)
        tokens.append(await api.access_token(alice.client_id, alice.secret, others))
        # The admin client holds every scope; narrowed to the other ones it is refused too.
        tokens.append(await api.access_token(api.admin.client_id, api.admin.secret, others))
    else:
        assert route.scope in ADMIN_SCOPES
        # An agent never holds an admin scope: not by default, and not when it asks for it.
        tokens.append(alice.token)
        asked = await api.token_response(
            alice.client_id, alice.secret, f"{route.scope} read:memory"
        )
        assert asked.status_code == 200, asked.text
        assert asked.json()["scope"].split() == ["read:memory"]
        tokens.append(asked.json()["access_token"])
        tokens.append(
            await api.access_token(api.admin.client_id, api.admin.secret, " ".join(MEMORY_SCOPES))
        )
    before = await _state(api, targets)
    for token in tokens:
        headers = {"Authorization": f"Bearer {token}"}
        response = await call(api.http, route, target_id(route, targets), headers, body)
        _assert_insufficient(response, route.scope)
    assert await _state(api, targets) == before


async def check_cross_tenant_not_found(api: Api, route: Route) -> None:
    """Another tenant's id answers the very bytes of a random id (apart from the id itself), and
    the other tenant's resource is untouched. Memory ids of another principal of the same tenant
    answer the same bytes too."""
    assert route.resource is not None
    other = await api.other_tenant()
    carol = await other.new_agent("carol")
    foreign = await _own_targets(other, carol)
    caller = (
        await api.new_agent("alice", scopes=_agent_scopes(route))
        if route.group == "memory"
        else api.admin
    )
    foreign_ids = [target_id(route, foreign)]
    if route.resource == "memory":
        bob = await api.new_agent("bob")
        foreign_ids.append((await _own_targets(api, bob)).memory_id)
    before = await _state(other, foreign)

    fresh = random_id()
    body = route.body(foreign) if route.body else None  # a valid body: only the id is wrong
    baseline = await call(api.http, route, fresh, caller.headers, body)
    baseline_problem = assert_problem(baseline, 404, route.not_found_slug)
    assert fresh in baseline_problem["detail"]
    expected = baseline.content.replace(fresh.encode(), b"{id}")
    for foreign_id in foreign_ids:
        response = await call(api.http, route, foreign_id, caller.headers, body)
        problem = assert_problem(response, 404, route.not_found_slug)
        assert {k: problem[k] for k in ("type", "title", "status")} == {
            k: baseline_problem[k] for k in ("type", "title", "status")
        }
        assert response.content.replace(foreign_id.encode(), b"{id}") == expected
        assert response.headers["content-length"] == baseline.headers["content-length"]
        assert response.headers.get("www-authenticate") is None

    assert await _state(other, foreign) == before
    # The owner still sees its memory / client exactly as before.
    check = await other.http.get(f"/v1/memories/{foreign.memory_id}", headers=carol.headers)
    assert check.status_code == 200, check.text
    assert check.json()["status"] == "live"
    client = await other.http.get(f"/v1/clients/{foreign.client_id}", headers=other.admin.headers)
    assert client.status_code == 200, client.text
    assert client.json()["disabled_at"] is None
    assert await other.access_token(carol.client_id, carol.secret)


async def check_minimal_scope(api: Api, route: Route) -> None:
    """A token holding only the route's scope is enough, and the answer carries the right data."""
    alice = await api.new_agent("alice", scopes=_agent_scopes(route))
    targets = await _own_targets(api, alice)
    caller = alice if route.scope in (*MEMORY_SCOPES, REVIEW) else api.admin
    scope = route.scope
    if str(route) == "PUT /v1/principals/{id}/roles/auditor":
        # Granting the auditor role hands out audit reading: the granter holds read:audit too
        # (nobody hands out more than they have; test_admin_ceilings.py covers the refusal).
        scope = f"{route.scope} read:audit"
    token = await api.access_token(caller.client_id, caller.secret, scope)
    headers = {"Authorization": f"Bearer {token}"}
    body = route.body(targets) if route.body else None
    if str(route) == "POST /v1/clients":
        # With manage:policy alone an admin registers clients for itself within its own scopes;
        # acting as another principal needs manage:tenant too (test_client_ceilings.py).
        body = {
            "principal_id": api.admin.principal_id,
            "name": "matrix",
            "kind": "admin",
            "scopes": [ADMIN_ONLY],
        }
    target, enabled_id = target_id(route, targets), ""
    if str(route) == "POST /v1/clients/{id}/enable":
        # Re-enabling hands credentials back: with manage:policy alone, only a client of the
        # caller within its own scopes (test_client_ceilings.py covers the refusals).
        own = await api.new_client(api.admin.principal_id, [ADMIN_ONLY], kind="admin")
        target = enabled_id = own["client"]["client_id"]
    if route.group == "audit":
        await run_checkpoints(api.runtime.sessionmaker, api.runtime.kek)
    if str(route) == "POST /v1/memories/{id}/reinstate":
        # Only a revoked memory can be reinstated.
        revoked = await call(api.http, ROUTE_REVOKE, target, headers, body)
        assert revoked.status_code == 200, revoked.text
    before = await count_memories(api.runtime)
    response = await call(api.http, route, target, headers, body)
    assert response.status_code == route.ok_status, response.text
    body_out: Any = None
    if response.headers.get("content-type", "").startswith("application/x-ndjson"):
        body_out = [json.loads(line) for line in response.text.splitlines()]
    elif response.content:
        body_out = response.json()
    projections: dict[str, Callable[[Any], tuple[Any, Any]]] = {
        "POST /v1/memories": lambda b: (
            (b["memory"]["provenance"]["writer_id"], b["memory"]["key"]),
            (alice.principal_id, "matrix"),
        ),
        "POST /v1/memories:batch": lambda b: (
            (
                b["count"],
                [(i["memory"]["provenance"]["writer_id"], i["memory"]["key"]) for i in b["items"]],
            ),
            (1, [(alice.principal_id, "matrix.batch")]),
        ),
        "GET /v1/memories": lambda b: ([i["id"] for i in b["items"]], [targets.memory_id]),
        "GET /v1/memories/counts": lambda b: (b["total"], 1),
        "POST /v1/memories/search": lambda b: (
            [h["memory"]["id"] for h in b["hits"]],
            [targets.memory_id],
        ),
        "GET /v1/memories/{id}": lambda b: (b["id"], targets.memory_id),
        "GET /v1/memories/{id}/history": lambda b: (
            [(i["id"], i["version"]) for i in b["items"]],
            [(targets.memory_id, 1)],
        ),
        "POST /v1/memories/{id}/revert": lambda b: (
            (b["memory"]["supersedes"], b["memory"]["version"], b["superseded"]),
            (targets.memory_id, 2, [targets.memory_id]),
        ),
        "DELETE /v1/memories/{id}": lambda b: (b, None),
        "POST /v1/memories/{id}/approve": lambda b: (b["type"], problem_uri("not-a-reviewer")),
        "POST /v1/memories/{id}/reject": lambda b: (b["type"], problem_uri("not-a-reviewer")),
        "GET /v1/spaces/{id}/proposals": lambda b: (b["type"], problem_uri("not-a-reviewer")),
        "POST /v1/memories/{id}/revoke": lambda b: (
            (b["memory_id"], b["revoked_by"], b["hidden"]),
            (targets.memory_id, alice.principal_id, 1),
        ),
        "POST /v1/memories/{id}/reinstate": lambda b: (
            (b["memory_id"], b["reinstated_by"], b["restored"]),
            (targets.memory_id, alice.principal_id, 1),
        ),
        "POST /v1/principals": lambda b: (
            (b["display_name"], b["kind"], b["personal_space_id"] is not None),
            ("matrix-bot", "agent", True),
        ),
        "GET /v1/principals": lambda b: (
            {i["id"] for i in b["items"]},
            {api.admin.principal_id, alice.principal_id},
        ),
        "GET /v1/principals/{id}": lambda b: (b["id"], alice.principal_id),
        "POST /v1/clients": lambda b: (
            (b["client"]["principal_id"], b["client"]["scopes"], b["client_secret"][:4]),
            (api.admin.principal_id, [ADMIN_ONLY], "mgs_"),
        ),
        "GET /v1/clients": lambda b: (
            {i["client_id"] for i in b["items"]},
            {api.admin.client_id, alice.client_id},
        ),
        "GET /v1/clients/{id}": lambda b: (
            (b["client_id"], "client_secret" in b),
            (alice.client_id, False),
        ),
        "POST /v1/clients/{id}/disable": lambda b: (
            (b["client_id"], b["disabled_at"] is not None),
            (alice.client_id, True),
        ),
        "POST /v1/clients/{id}/enable": lambda b: (
            (b["client_id"], b["disabled_at"]),
            (enabled_id, None),
        ),
        "PUT /v1/principals/{id}/roles/auditor": lambda b: (
            (b["principal_id"], b["role"]),
            (alice.principal_id, "auditor"),
        ),
        "DELETE /v1/principals/{id}/roles/auditor": lambda b: (b, None),
        "POST /v1/issuers": lambda b: (
            (b["issuer"], b["jwks_url"], b["algorithms"], b["subject_claim"]),
            (
                "https://login.matrix.test",
                "https://login.matrix.test/jwks",
                ["RS256", "ES256"],
                "sub",
            ),
        ),
        "GET /v1/issuers": lambda b: ([i["id"] for i in b["items"]], [targets.issuer_id]),
        "GET /v1/issuers/{id}": lambda b: (b["id"], targets.issuer_id),
        "DELETE /v1/issuers/{id}": lambda b: (b, None),
        "GET /v1/audit/events": lambda b: (
            ({i["tenant_id"] for i in b["items"]}, len(b["items"]) > 0),
            ({api.tenant_id}, True),
        ),
        "GET /v1/audit/export": lambda b: (
            ([e["seq"] for e in b], {e["tenant_id"] for e in b}),
            (list(range(1, len(b) + 1)), {api.tenant_id}),
        ),
        "GET /v1/audit/verify": lambda b: ((b["ok"], b["checked"] > 0), (True, True)),
        "GET /v1/audit/checkpoints/latest": lambda b: (
            (b["tenant_id"], b["seq"] > 0),
            (api.tenant_id, True),
        ),
        "GET /v1/audit/keys": lambda b: (
            {(k["kty"], k["crv"], "d" in k) for k in b["keys"]},
            {("OKP", "Ed25519", False)},
        ),
    }
    actual, expected = projections[str(route)](body_out)
    assert actual == expected
    # A delete retracts in place (the row stays as a stub); a revert writes a new version.
    delta = {
        "POST /v1/memories": 1,
        "POST /v1/memories:batch": 1,
        "POST /v1/memories/{id}/revert": 1,
    }.get(str(route), 0)
    assert await count_memories(api.runtime) == before + delta
    if route.group == "admin":
        assert "mgs_" not in response.text or str(route) == "POST /v1/clients"
