"""Per-tenant external issuers through the API: a tenant admin registers its IdP, its tokens work
in that tenant only (whatever they claim), and nothing a tenant registers reaches another one.
Every IdP is a real JWKS over HTTP on 127.0.0.1 (tests/integration/issuers/support.py)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from service.app import create_app
from service.embeddings import Embedder
from service.runtime import build_runtime
from tests.conftest import PUBLIC_URL, TRUSTED_TEST_ISSUER, make_settings
from tests.fixtures.api import Api
from tests.fixtures.postgres import app_login
from tests.integration.auth.forge import assert_token_rejected, get_protected
from tests.integration.issuers.support import (
    LoopbackIdp,
    bearer,
    issuer_app,
    mapped,
    register,
    serving,
)
from tests.integration.memory.support import assert_problem, memory_rows, scalar

IDP_A = "https://login.acme.test"
IDP_B = "https://login.globex.test"
AUD_A = "memgate-acme"
AUD_B = "memgate-globex"
SUBJECT = "user-42"
ROUTES = (
    ("POST", "/v1/issuers"),
    ("GET", "/v1/issuers"),
    ("GET", "/v1/issuers/{id}"),
    ("DELETE", "/v1/issuers/{id}"),
)


@pytest.fixture
def idp_a() -> Iterator[LoopbackIdp]:
    with serving(LoopbackIdp(IDP_A)) as idp:
        yield idp


@pytest.fixture
def idp_b() -> Iterator[LoopbackIdp]:
    with serving(LoopbackIdp(IDP_B)) as idp:
        yield idp


@pytest.fixture
async def acme(database_url: str, tmp_path: Path, embedder: Embedder) -> AsyncIterator[Api]:
    async with issuer_app(database_url, tmp_path, embedder) as api:
        yield api


def _body(idp: LoopbackIdp, audience: str, **fields: Any) -> dict[str, Any]:
    return {"issuer": idp.issuer, "audience": audience, "jwks_url": idp.url} | fields


async def _issuer_rows(api: Api) -> int:
    count: int = await scalar(api.runtime, "SELECT count(*) FROM tenant_issuers")
    return count


async def test_every_route_needs_a_token_the_scope_and_hides_other_tenants(
    acme: Api, idp_a: LoopbackIdp
) -> None:
    """No token: 401; a token without manage:policy: 403 naming it; another tenant's issuer id:
    the very bytes of an unknown id, and the other tenant's issuer untouched."""
    globex = await acme.other_tenant()
    foreign = await register(globex, **_body(idp_a, AUD_B))
    agent = await acme.new_agent("alice")
    body = _body(idp_a, AUD_A)
    for method, template in ROUTES:
        path = template.replace("{id}", foreign["id"])
        json_body = body if method == "POST" else None
        anonymous = await acme.http.request(method, path, json=json_body)
        assert_problem(anonymous, 401, "unauthenticated")
        refused = await acme.http.request(method, path, json=json_body, headers=agent.headers)
        assert assert_problem(refused, 403, "insufficient-scope")["required_scope"] == (
            "manage:policy"
        )
    assert await _issuer_rows(acme) == 1
    for method in ("GET", "DELETE"):
        unknown = str(uuid.uuid4())
        baseline = await acme.http.request(
            method, f"/v1/issuers/{unknown}", headers=acme.admin.headers
        )
        assert_problem(baseline, 404, "issuer-not-found")
        answer = await acme.http.request(
            method, f"/v1/issuers/{foreign['id']}", headers=acme.admin.headers
        )
        assert_problem(answer, 404, "issuer-not-found")
        assert answer.content.replace(foreign["id"].encode(), b"{id}") == (
            baseline.content.replace(unknown.encode(), b"{id}")
        )
    listed = await acme.http.get("/v1/issuers", headers=acme.admin.headers)
    assert listed.json() == {"items": []}
    still = await globex.http.get(f"/v1/issuers/{foreign['id']}", headers=globex.admin.headers)
    assert still.status_code == 200
    assert still.json() == foreign


async def test_registered_idp_tokens_read_and_write_in_its_tenant_only(
    acme: Api, idp_a: LoopbackIdp
) -> None:
    early = idp_a.token(AUD_A, SUBJECT)
    assert_token_rejected(await get_protected(acme.http, early), early)
    created = await register(acme, **_body(idp_a, AUD_A))
    assert {k: created[k] for k in ("issuer", "audience", "jwks_url", "algorithms")} == {
        "issuer": IDP_A,
        "audience": AUD_A,
        "jwks_url": idp_a.url,
        "algorithms": ["RS256", "ES256"],
    }
    listed = await acme.http.get("/v1/issuers", headers=acme.admin.headers)
    assert [item["id"] for item in listed.json()["items"]] == [created["id"]]
    principal = await mapped(acme, IDP_A, SUBJECT)
    # The pair refused a moment ago works from the next request (misses are never cached).
    assert (await get_protected(acme.http, early)).status_code == 200
    user = bearer(idp_a.token(AUD_A, SUBJECT))
    written = await acme.remember(user, key="deploy.window", value="deploys are on fridays")
    assert written["provenance"]["writer_id"] == principal["id"]
    found = await acme.search(user, "when are deploys", k=5)
    assert [hit["memory"]["id"] for hit in found.json()["hits"]] == [written["id"]]
    rows = await memory_rows(acme.runtime)
    assert [(str(r["tenant_id"]), str(r["owner_id"])) for r in rows] == [
        (acme.tenant_id, principal["id"])
    ]
    # Another tenant's agent sees none of it; the IdP was asked for its keys once.
    globex = await acme.other_tenant()
    carol = await globex.new_agent("carol")
    assert (await globex.search(carol, "when are deploys", k=5)).json()["hits"] == []
    assert idp_a.hits == 1


async def test_a_token_naming_another_tenant_is_refused(
    acme: Api, idp_a: LoopbackIdp, idp_b: LoopbackIdp
) -> None:
    """The issuer's tenant is the token's tenant: a `tenant` claim naming another one is refused,
    even where that tenant maps the same subject of the same IdP (with its own audience)."""
    globex = await acme.other_tenant()
    await register(acme, **_body(idp_a, AUD_A))
    await register(globex, **_body(idp_a, AUD_B))
    await mapped(acme, IDP_A, SUBJECT)
    await mapped(globex, IDP_A, SUBJECT)
    for claim in (globex.tenant_id, "not-a-tenant", str(uuid.uuid4())):
        token = idp_a.token(AUD_A, SUBJECT, tenant=claim)
        assert_token_rejected(await get_protected(acme.http, token), token)
    assert (await get_protected(acme.http, idp_a.token(AUD_A, SUBJECT))).status_code == 200
    named = idp_a.token(AUD_A, SUBJECT, tenant=acme.tenant_id)
    assert (await get_protected(acme.http, named)).status_code == 200
    # The same IdP's token for globex's audience lands in globex, not in acme.
    user = bearer(idp_a.token(AUD_B, SUBJECT))
    await acme.remember(user, key="where", value="written through the globex audience")
    assert {str(r["tenant_id"]) for r in await memory_rows(acme.runtime)} == {globex.tenant_id}
    # An IdP nobody registered is not trusted at all.
    stranger = idp_b.token(AUD_A, SUBJECT)
    assert_token_rejected(await get_protected(acme.http, stranger), stranger)


async def test_nobody_registers_a_pair_another_tenant_holds(acme: Api, idp_a: LoopbackIdp) -> None:
    """409 with the same bytes whether the pair is the caller's own or another tenant's (so
    the answer says nothing about other tenants), and nothing stored."""
    globex = await acme.other_tenant()
    await register(acme, **_body(idp_a, AUD_A))
    other = await globex.http.post(
        "/v1/issuers", json=_body(idp_a, AUD_A), headers=globex.admin.headers
    )
    own = await acme.http.post("/v1/issuers", json=_body(idp_a, AUD_A), headers=acme.admin.headers)
    assert_problem(other, 409, "issuer-taken")
    assert other.content == own.content
    assert acme.tenant_id not in other.text
    assert await _issuer_rows(acme) == 1
    # A trailing slash is another `iss`, but the pair with another audience is free.
    assert (await register(globex, **_body(idp_a, AUD_B)))["audience"] == AUD_B


@pytest.mark.parametrize("issuer", [PUBLIC_URL, PUBLIC_URL + "/", TRUSTED_TEST_ISSUER])
async def test_memgates_own_and_the_operators_issuers_are_reserved(
    acme: Api, idp_a: LoopbackIdp, issuer: str
) -> None:
    body = _body(idp_a, "memgate", issuer=issuer)
    response = await acme.http.post("/v1/issuers", json=body, headers=acme.admin.headers)
    problem = assert_problem(response, 422, "issuer-reserved")
    assert "operator" in problem["detail"]
    assert await _issuer_rows(acme) == 0


async def test_deleting_the_issuer_stops_its_tokens_on_the_next_request(
    acme: Api, idp_a: LoopbackIdp
) -> None:
    created = await register(acme, **_body(idp_a, AUD_A))
    await mapped(acme, IDP_A, SUBJECT)
    token = idp_a.token(AUD_A, SUBJECT)
    assert (await get_protected(acme.http, token)).status_code == 200
    deleted = await acme.http.delete(f"/v1/issuers/{created['id']}", headers=acme.admin.headers)
    assert deleted.status_code == 204, deleted.text
    # Within the config cache's lifetime: the entrance statement finds the row gone.
    assert_token_rejected(await get_protected(acme.http, token), token)
    gone = await acme.http.get(f"/v1/issuers/{created['id']}", headers=acme.admin.headers)
    assert_problem(gone, 404, "issuer-not-found")
    assert await _issuer_rows(acme) == 0
    # Its subjects can no longer be mapped either.
    again = await acme.http.post(
        "/v1/principals",
        json={"display_name": "x", "external_issuer": IDP_A, "external_subject": "other"},
        headers=acme.admin.headers,
    )
    assert_problem(again, 422, "external-issuer-untrusted")


async def test_principals_map_only_to_issuers_their_tenant_trusts(
    acme: Api, idp_a: LoopbackIdp
) -> None:
    body = {"display_name": "x", "external_issuer": IDP_A, "external_subject": SUBJECT}
    before = await acme.http.post("/v1/principals", json=body, headers=acme.admin.headers)
    assert_problem(before, 422, "external-issuer-untrusted")
    await register(acme, **_body(idp_a, AUD_A))
    assert (await mapped(acme, IDP_A, SUBJECT))["external_issuer"] == IDP_A
    globex = await acme.other_tenant()
    foreign = await globex.http.post("/v1/principals", json=body, headers=globex.admin.headers)
    assert_problem(foreign, 422, "external-issuer-untrusted")
    assert (
        await scalar(
            acme.runtime, "SELECT count(*) FROM principals WHERE external_subject IS NOT NULL"
        )
        == 1
    )


async def test_an_idp_token_gets_no_admin_scope_it_was_not_approved_for(
    acme: Api, idp_a: LoopbackIdp
) -> None:
    """A tenant admin's IdP cannot escalate: admin scopes in its tokens are dropped unless the
    owner approved the mapping, so the token cannot even manage issuers."""
    await register(acme, **_body(idp_a, AUD_A))
    await mapped(acme, IDP_A, SUBJECT)
    token = idp_a.token(AUD_A, SUBJECT, scope="read:memory manage:policy manage:tenant read:audit")
    for path in ("/v1/issuers", "/v1/principals", "/v1/audit/events"):
        response = await acme.http.get(path, headers={"Authorization": f"Bearer {token}"})
        assert_problem(response, 403, "insufficient-scope")
    assert (await get_protected(acme.http, token)).status_code == 200


@pytest.mark.parametrize(
    ("fields", "slug", "names"),
    [
        ({"jwks_url": "http://jwks.acme.test/keys"}, "issuer-invalid", "https"),
        ({"jwks_url": "https://10.0.0.7/keys"}, "issuer-invalid", "public"),
        ({"jwks_url": "https://169.254.169.254/latest"}, "issuer-invalid", "public"),
        ({"jwks_url": "https://user:pw@jwks.acme.test/keys"}, "issuer-invalid", "user info"),
        ({"issuer": "login.acme.test"}, "issuer-invalid", "issuer"),
        ({"algorithms": ["HS256"]}, "issuer-invalid", "HS256"),
        ({"algorithms": ["none"]}, "issuer-invalid", "none"),
        ({"algorithms": []}, "invalid-request", "algorithms"),
        ({"subject_claim": ""}, "invalid-request", "subject_claim"),
        ({"scope_claim": "a" * 65}, "invalid-request", "scope_claim"),
        ({"client_id_claim": "has space"}, "invalid-request", "client_id_claim"),
        ({"audience": ""}, "invalid-request", "audience"),
        ({"tenant_id": str(uuid.uuid4())}, "invalid-request", "tenant_id"),
    ],
)
async def test_bad_input_is_a_correctable_422_and_stores_nothing(
    acme: Api, idp_a: LoopbackIdp, fields: dict[str, Any], slug: str, names: str
) -> None:
    body = _body(idp_a, AUD_A) | fields
    response = await acme.http.post("/v1/issuers", json=body, headers=acme.admin.headers)
    problem = assert_problem(response, 422, slug)
    assert names in response.text, problem
    assert await _issuer_rows(acme) == 0


async def test_loopback_jwks_urls_need_the_operator_setting(
    database_url: str, tmp_path: Path, embedder: Embedder, idp_a: LoopbackIdp
) -> None:
    async with issuer_app(
        database_url, tmp_path, embedder, tenant_issuers_allow_loopback=False
    ) as api:
        for url in (idp_a.url, "https://127.0.0.1/jwks", "https://[::1]/jwks"):
            response = await api.http.post(
                "/v1/issuers", json=_body(idp_a, AUD_A, jwks_url=url), headers=api.admin.headers
            )
            assert_problem(response, 422, "issuer-invalid")
        assert await _issuer_rows(api) == 0


async def test_a_slow_or_dead_jwks_fails_its_tokens_in_time_and_stalls_nobody_else(
    acme: Api, idp_a: LoopbackIdp
) -> None:
    """A JWKS that answers after 5 s (the bound is 1 s) and one nobody listens on: their tokens
    are 401 within the bound, the next ones at once (no second fetch), and another tenant's
    requests meanwhile take no longer than usual."""
    idp_a.delay = 5.0
    await register(acme, **_body(idp_a, AUD_A))
    await mapped(acme, IDP_A, SUBJECT)
    dead = LoopbackIdp("https://login.dead.test")
    await register(acme, issuer=dead.issuer, audience=AUD_A, jwks_url="http://127.0.0.1:9/jwks")
    await mapped(acme, dead.issuer, SUBJECT + "-dead")
    globex = await acme.other_tenant()
    carol = await globex.new_agent("carol")

    async def timed(token: str) -> tuple[int, float]:
        started = time.perf_counter()
        response = await get_protected(acme.http, token)
        return response.status_code, time.perf_counter() - started

    slow_token = idp_a.token(AUD_A, SUBJECT)
    slow = asyncio.create_task(timed(slow_token))
    others = [await timed(carol.token) for _ in range(5)]
    status, took = await slow
    assert status == 401
    assert took < 3.0, took
    assert [code for code, _ in others] == [200] * 5
    assert max(elapsed for _, elapsed in others) < 1.0, others
    again = await timed(slow_token)
    assert again[0] == 401
    assert again[1] < 0.5, again
    assert idp_a.hits == 1
    dead_status, dead_took = await timed(dead.token(AUD_A, SUBJECT + "-dead"))
    assert dead_status == 401
    assert dead_took < 3.0, dead_took


async def test_operator_issuers_still_name_their_tenant_in_a_claim(
    database_url: str, tmp_path: Path, embedder: Embedder, idp_a: LoopbackIdp
) -> None:
    """`MEMGATE_EXTERNAL_ISSUERS` keep working beside registered ones, unchanged: the tenant
    comes from the token's claim."""
    from service.settings import ExternalIssuer

    operator = ExternalIssuer(issuer=IDP_B, audience="memgate", jwks_url=idp_a.url)
    async with issuer_app(database_url, tmp_path, embedder, external_issuers=(operator,)) as api:
        await api.new_principal("operator user", external_issuer=IDP_B, external_subject="op-user")
        claims = {"tenant": api.tenant_id}
        token = LoopbackIdp(IDP_B, key=idp_a.key).token("memgate", "op-user", **claims)
        assert (await get_protected(api.http, token)).status_code == 200
        unnamed = LoopbackIdp(IDP_B, key=idp_a.key).token("memgate", "op-user")
        assert_token_rejected(await get_protected(api.http, unnamed), unnamed)
        reserved = await api.http.post(
            "/v1/issuers", json=_body(idp_a, "other", issuer=IDP_B), headers=api.admin.headers
        )
        assert_problem(reserved, 422, "issuer-reserved")


async def test_the_issuer_of_the_last_working_admin_is_not_deleted(
    acme: Api, idp_a: LoopbackIdp
) -> None:
    """An approved admin mapped to a registered issuer is a working admin (so the owner may
    disable its own last client), and that issuer cannot then be deleted: nobody could manage
    the tenant any more. 409, nothing changed, the IdP admin still at work."""
    created = await register(acme, **_body(idp_a, AUD_A))
    admin = await mapped(acme, IDP_A, "idp-admin")
    for role in ("external_admin", "policy_admin"):
        added = await acme.http.put(
            f"/v1/roles/{role}/members/{admin['id']}", headers=acme.admin.headers
        )
        assert added.status_code == 200, added.text
    # The owner's client is also the only auditor credential: the IdP admin audits too.
    audits = await acme.http.put(
        f"/v1/principals/{admin['id']}/roles/auditor", headers=acme.admin.headers
    )
    assert audits.status_code == 200, audits.text
    disabled = await acme.http.post(
        f"/v1/clients/{acme.admin.client_id}/disable", headers=acme.admin.headers
    )
    assert disabled.status_code == 200, disabled.text
    # Every admin scope: deleting the issuer an approved admin is mapped to takes all of them
    # (red-team F1), so the last-admin rule is what refuses here.
    every = "manage:erasure manage:policy manage:tenant read:audit run:jobs read:memory"
    token = idp_a.token(AUD_A, "idp-admin", scope=every)
    headers = {"Authorization": f"Bearer {token}"}
    refused = await acme.http.delete(f"/v1/issuers/{created['id']}", headers=headers)
    assert_problem(refused, 409, "last-role-holder")
    assert await _issuer_rows(acme) == 1
    listed = await acme.http.get("/v1/issuers", headers=headers)
    assert [item["id"] for item in listed.json()["items"]] == [created["id"]]


async def test_a_pair_that_moves_to_another_tenant_never_verifies_for_the_old_one(
    database_url: str, tmp_path: Path, embedder: Embedder, idp_a: LoopbackIdp
) -> None:
    """acme deletes its registration and globex takes the pair: the token that worked in acme
    is refused while acme's config is still cached (the entrance finds the row gone), and
    once the cache forgets it, the same token lands in globex, never in acme."""
    async with issuer_app(database_url, tmp_path, embedder, tenant_issuer_cache_seconds=1) as acme:
        globex = await acme.other_tenant()
        created = await register(acme, **_body(idp_a, AUD_A))
        await mapped(acme, IDP_A, SUBJECT)
        token = idp_a.token(AUD_A, SUBJECT)
        assert (await get_protected(acme.http, token)).status_code == 200
        gone = await acme.http.delete(f"/v1/issuers/{created['id']}", headers=acme.admin.headers)
        assert gone.status_code == 204
        await register(globex, **_body(idp_a, AUD_A))
        await mapped(globex, IDP_A, SUBJECT)
        assert_token_rejected(await get_protected(acme.http, token), token)
        await asyncio.sleep(1.1)
        await acme.remember(bearer(token), key="moved", value="written after the move")
        assert {str(r["tenant_id"]) for r in await memory_rows(acme.runtime)} == {globex.tenant_id}


async def test_issuer_calls_are_audited_with_ids_and_counts_only(
    acme: Api, idp_a: LoopbackIdp
) -> None:
    """Each call is a row of its tenant's chain naming the registration by id; its URLs and
    audience stay out of the log. A refused registration is audited as a denial."""
    created = await register(acme, **_body(idp_a, AUD_A))
    await acme.http.get("/v1/issuers", headers=acme.admin.headers)
    await acme.http.post("/v1/issuers", json=_body(idp_a, AUD_A), headers=acme.admin.headers)
    await acme.http.delete(f"/v1/issuers/{created['id']}", headers=acme.admin.headers)
    events = await acme.http.get(
        "/v1/audit/events", params={"limit": 100}, headers=acme.admin.headers
    )
    assert events.status_code == 200, events.text
    rows = [e for e in events.json()["items"] if e["action"].startswith("issuer.")]
    summary = sorted(
        (e["action"], e["decision"], e["status"], e["target_ids"], e["result_count"]) for e in rows
    )
    assert summary == sorted(
        [
            ("issuer.create", "allow", 201, [created["id"]], None),
            ("issuer.list", "allow", 200, [], 1),
            ("issuer.create", "deny", 409, [], None),
            ("issuer.delete", "allow", 204, [created["id"]], None),
        ]
    )
    assert {e["reason"] for e in rows if e["decision"] == "deny"} == {"issuer-taken"}
    for text in (idp_a.url, AUD_A, "login.acme.test"):
        assert text not in events.text


async def test_a_delete_in_one_worker_stops_the_token_in_another(
    database_url: str, tmp_path: Path, embedder: Embedder, idp_a: LoopbackIdp
) -> None:
    """Two runtimes on one database stand for two workers, each with its own config cache:
    the one that did not delete, its cache warm, refuses the token on its next request."""
    settings = make_settings(database_url, tmp_path, tenant_issuers_allow_loopback=True)
    runtimes = [
        await build_runtime(settings, app_login(database_url), embedder, owner_url=database_url)
        for _ in range(2)
    ]
    try:
        async with (
            AsyncTestClient(app=create_app(runtimes[0]), base_url=PUBLIC_URL) as first,
            AsyncTestClient(app=create_app(runtimes[1]), base_url=PUBLIC_URL) as second,
        ):
            acme = await Api.bootstrap(first, runtimes[0])
            created = await register(acme, **_body(idp_a, AUD_A))
            await mapped(acme, IDP_A, SUBJECT)
            token = idp_a.token(AUD_A, SUBJECT)
            for http in (first, second):
                assert (await get_protected(http, token)).status_code == 200
            deleted = await first.delete(f"/v1/issuers/{created['id']}", headers=acme.admin.headers)
            assert deleted.status_code == 204
            assert_token_rejected(await get_protected(second, token), token)
    finally:
        for runtime in runtimes:
            await runtime.close()


async def test_the_issuer_of_the_last_working_auditor_is_not_deleted(
    acme: Api, idp_a: LoopbackIdp
) -> None:
    """The same rule for the audit log: once the IdP admin is the only auditor left, its
    issuer stays (409, nothing changed)."""
    created = await register(acme, **_body(idp_a, AUD_A))
    admin = await mapped(acme, IDP_A, "idp-auditor")
    added = await acme.http.put(
        f"/v1/roles/external_admin/members/{admin['id']}", headers=acme.admin.headers
    )
    assert added.status_code == 200, added.text
    audits = await acme.http.put(
        f"/v1/principals/{admin['id']}/roles/auditor", headers=acme.admin.headers
    )
    assert audits.status_code == 200, audits.text
    owner = acme.admin.principal_id
    gone = await acme.http.delete(
        f"/v1/principals/{owner}/roles/auditor", headers=acme.admin.headers
    )
    assert gone.status_code == 204, gone.text
    refused = await acme.http.delete(f"/v1/issuers/{created['id']}", headers=acme.admin.headers)
    body = assert_problem(refused, 409, "last-role-holder")
    assert "auditor" in body["detail"]
    assert await _issuer_rows(acme) == 1
