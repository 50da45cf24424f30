"""A trusted external IdP: its JWKS comes from a real local HTTP server, its tokens map to memgate
principals through `external_subject`, and nothing else it could send is trusted."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from joserfc.jwk import ECKey, RSAKey

from service.auth.tokens import CachedKeySet, TokenRejected, http_jwks_fetcher
from service.embeddings import Embedder
from tests.fixtures.api import Agent, Api
from tests.integration.auth.external_idp import (
    ES256_KID,
    IDP,
    SUBJECT,
    FakeIdp,
    idp_app,
    idp_claims,
)
from tests.integration.auth.forge import (
    assert_token_rejected,
    attacker_key,
    embedded_key,
    get_protected,
    hs256_with_secret,
    sign,
)
from tests.integration.memory.support import assert_problem


async def _mapped_principal(api: Api, subject: str = SUBJECT) -> dict[str, Any]:
    principal = await api.new_principal(
        "external user", kind="user", external_issuer=IDP, external_subject=subject
    )
    assert principal["external_issuer"] == IDP
    assert principal["external_subject"] == subject
    return principal


async def test_idp_token_writes_and_searches_memories(ext_api: Api, idp: FakeIdp) -> None:
    principal = await _mapped_principal(ext_api)
    token = sign(idp.es256, idp_claims(ext_api.tenant_id))
    agent = Agent(principal["id"], "", "", token)
    written = await ext_api.remember(
        agent, key="deploy.window", value="deploys happen friday 10-12"
    )
    assert written["provenance"]["writer_id"] == principal["id"]
    response = await ext_api.search(agent, "when do we deploy", k=5)
    assert response.status_code == 200, response.text
    hits = response.json()["hits"]
    assert [hit["memory"]["id"] for hit in hits] == [written["id"]]
    # An RS256 key of the same JWKS works too.
    rs_token = sign(idp.rs256, idp_claims(ext_api.tenant_id), alg="RS256")
    assert (await get_protected(ext_api.http, rs_token)).status_code == 200
    assert idp.hits == 1


async def test_idp_token_scope_is_a_ceiling(ext_api: Api, idp: FakeIdp) -> None:
    await _mapped_principal(ext_api)
    token = sign(idp.es256, idp_claims(ext_api.tenant_id, scope="read:memory"))
    assert (await get_protected(ext_api.http, token)).status_code == 200
    write = await ext_api.http.post(
        "/v1/memories",
        json={"subject": "service:billing", "kind": "fact", "key": "k", "value": "v"},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert write.status_code == 403, write.text


async def test_unmapped_subject_is_rejected(ext_api: Api, idp: FakeIdp) -> None:
    await _mapped_principal(ext_api)
    for subject in ("ext-user-2", "EXT-USER-1", "ext-user-1 ", "' OR 1=1 --"):
        token = sign(idp.es256, idp_claims(ext_api.tenant_id, sub=subject))
        assert_token_rejected(await get_protected(ext_api.http, token), token)
    # The mapped subject under another tenant id does not resolve either.
    globex = await ext_api.other_tenant("globex")
    for tenant in (globex.tenant_id, str(uuid.uuid4())):
        token = sign(idp.es256, idp_claims(tenant))
        assert_token_rejected(await get_protected(ext_api.http, token), token)
    # The embedded principal ids are not external subjects.
    token = sign(idp.es256, idp_claims(ext_api.tenant_id, sub=ext_api.admin.principal_id))
    assert_token_rejected(await get_protected(ext_api.http, token), token)
    assert idp.hits == 1


async def test_key_not_in_the_idp_jwks_is_rejected(ext_api: Api, idp: FakeIdp) -> None:
    await _mapped_principal(ext_api)
    good = sign(idp.es256, idp_claims(ext_api.tenant_id))
    assert (await get_protected(ext_api.http, good)).status_code == 200
    assert idp.hits == 1
    stranger = attacker_key("stranger")
    claims = idp_claims(ext_api.tenant_id)
    forged = [
        sign(stranger, claims),  # a kid the IdP never published
        sign(stranger, claims, kid=ES256_KID),  # the IdP's kid, someone else's key
        sign(stranger, claims, kid="stranger", jwk=stranger.as_dict(private=False)),
        sign(stranger, claims, kid="stranger", jku="http://127.0.0.1:9/jwks"),
    ]
    forged += [sign(attacker_key(f"junk-{i}"), claims) for i in range(20)]
    for token in forged:
        assert_token_rejected(await get_protected(ext_api.http, token), token)
    # One fetch for the first token; unknown kids within the refetch gap cost nothing.
    assert idp.hits == 1


async def test_idp_tokens_must_pass_the_whole_checklist(ext_api: Api, idp: FakeIdp) -> None:
    await _mapped_principal(ext_api)
    key = idp.es256
    tenant = ext_api.tenant_id
    public_pem = key.as_pem(private=False)
    now = int(time.time())
    bad = [
        sign(key, idp_claims(tenant), typ="JWT"),
        sign(key, idp_claims(tenant), typ=None),
        sign(key, idp_claims(tenant, aud="someone-else")),
        sign(key, idp_claims(tenant, aud=None)),
        sign(key, idp_claims(tenant, aud=["other-api", "memgate"])),  # review item 9
        sign(key, idp_claims(tenant, aud=["memgate", "account"])),
        sign(key, idp_claims(tenant, exp=now - 120)),
        sign(key, idp_claims(tenant, nbf=now + 120)),
        sign(key, idp_claims(tenant, exp=now + 7200)),  # beyond the max lifetime
        sign(key, idp_claims(tenant, tenant=None)),
        hs256_with_secret(
            {"alg": "HS256", "typ": "at+jwt", "kid": ES256_KID}, idp_claims(tenant), public_pem
        ),
    ]
    # Algorithms outside the IdP's allow-list (RS256, ES256), even with the IdP's own RSA key.
    p384 = ECKey.generate_key("P-384", parameters={"kid": ES256_KID})
    bad.append(sign(p384, idp_claims(tenant), alg="ES384"))
    rsa_private = {k: v for k, v in idp.rs256.as_dict(private=True).items() if k != "alg"}
    bad.append(sign(RSAKey.import_key(rsa_private), idp_claims(tenant), alg="PS256"))
    for token in bad:
        assert_token_rejected(await get_protected(ext_api.http, token), token)


async def test_issuers_do_not_vouch_for_each_other(ext_api: Api, idp: FakeIdp) -> None:
    """The key source is chosen by `iss`: the IdP's key cannot sign embedded tokens and the
    embedded key cannot sign IdP tokens."""
    principal = await _mapped_principal(ext_api)
    runtime = ext_api.runtime
    alice = await ext_api.new_agent("alice")
    as_embedded = {
        "iss": runtime.settings.server.public_url,
        "aud": "memgate",
        "sub": alice.principal_id,
        "tenant": ext_api.tenant_id,
        "client_id": alice.client_id,
        "scope": "read:memory",
        "jti": uuid.uuid4().hex,
        "iat": int(time.time()),
        "exp": int(time.time()) + 300,
    }
    by_idp_key = sign(idp.es256, as_embedded)
    assert_token_rejected(await get_protected(ext_api.http, by_idp_key), by_idp_key)
    real = await embedded_key(runtime)
    by_embedded_key = sign(real, idp_claims(ext_api.tenant_id))
    assert_token_rejected(await get_protected(ext_api.http, by_embedded_key), by_embedded_key)
    # Both issuers still work for their own tokens.
    assert (await get_protected(ext_api.http, alice.token)).status_code == 200
    own = sign(idp.es256, idp_claims(ext_api.tenant_id))
    assert (await get_protected(ext_api.http, own)).status_code == 200
    assert principal["id"] != alice.principal_id


async def test_idp_key_rotation_is_picked_up_after_the_refetch_gap(
    database_url: str, tmp_path: Path, embedder: Embedder, idp: FakeIdp
) -> None:
    gap = 1.0
    async with idp_app(database_url, tmp_path, embedder, idp, jwks_refetch_seconds=gap) as api:
        await _mapped_principal(api)
        old = sign(idp.es256, idp_claims(api.tenant_id))
        assert (await get_protected(api.http, old)).status_code == 200
        assert idp.hits == 1
        rotated = ECKey.generate_key(
            "P-256", parameters={"kid": "idp-es256-2", "alg": "ES256", "use": "sig"}
        )
        with idp.lock:
            idp.keys.append(rotated)
        await asyncio.sleep(gap + 0.1)
        new = sign(rotated, idp_claims(api.tenant_id))
        second_fetch_not_before = time.monotonic()
        assert (await get_protected(api.http, new)).status_code == 200
        assert idp.hits == 2
        # A burst of unknown kids right after: at most one further fetch per elapsed gap (none
        # when the burst is quicker than a gap), never one per token. The bound follows the
        # clock, not a guess of how fast a busy box sends ten requests.
        junk_tokens = [
            sign(attacker_key(f"junk-{i}"), idp_claims(api.tenant_id)) for i in range(10)
        ]
        for junk in junk_tokens:
            assert_token_rejected(await get_protected(api.http, junk), junk)
        gaps_elapsed = int((time.monotonic() - second_fetch_not_before) / gap)
        assert gaps_elapsed < len(junk_tokens), "the burst was too slow to test the gap"
        assert 2 <= idp.hits <= 2 + gaps_elapsed


async def test_unreachable_idp_at_first_use_is_401_not_500(ext_api: Api, idp: FakeIdp) -> None:
    await _mapped_principal(ext_api)
    with idp.lock:
        idp.status = 503
    token = sign(idp.es256, idp_claims(ext_api.tenant_id))
    assert_token_rejected(await get_protected(ext_api.http, token), token)


async def test_stale_keys_are_served_while_the_idp_is_down_without_hammering_it(
    idp: FakeIdp,
) -> None:
    """Past its TTL the key set refetches; if the IdP then fails, the last good keys keep
    serving, and the IdP is not asked again on every lookup."""
    keys = CachedKeySet(http_jwks_fetcher(idp.url, timeout=2.0), ttl=0.0, min_refetch=30.0)
    assert await keys.find(ES256_KID) is not None
    assert idp.hits == 1
    with idp.lock:
        idp.status = 500
    for _ in range(10):
        assert await keys.find(ES256_KID) is not None
    assert idp.hits <= 2
    with pytest.raises(TokenRejected):
        await CachedKeySet(http_jwks_fetcher(idp.url, timeout=2.0)).find(ES256_KID)


async def test_admin_scopes_from_an_idp_never_reach_an_agent_principal(
    ext_api: Api, idp: FakeIdp
) -> None:
    """Red-team F5: the IdP may put anything in `scope`; an agent principal still gets no admin
    scope, so it cannot register clients (here: for the tenant's bootstrap admin)."""
    await ext_api.new_principal(
        "external bot", kind="agent", external_issuer=IDP, external_subject=SUBJECT
    )
    token = sign(
        idp.es256,
        idp_claims(ext_api.tenant_id, scope="manage:policy manage:tenant read:memory"),
    )
    headers = {"Authorization": f"Bearer {token}"}
    assert (await ext_api.http.get("/v1/memories", headers=headers)).status_code == 200
    minted = await ext_api.http.post(
        "/v1/clients",
        json={
            "principal_id": ext_api.admin.principal_id,
            "name": "escalate",
            "kind": "admin",
            "scopes": ["manage:policy"],
        },
        headers=headers,
    )
    assert minted.status_code == 403, minted.text
    assert minted.json()["required_scope"] == "manage:policy"
    clients = await ext_api.http.get("/v1/clients", headers=ext_api.admin.headers)
    assert [c["name"] for c in clients.json()["items"]] == ["bootstrap-admin"]


async def _lower_admin(api: Api) -> dict[str, str]:
    """A policy admin holding `manage:policy` only (no audit, no tenant scope)."""
    officer = await api.new_principal("officer")
    client = await api.new_client(officer["id"], ["manage:policy"], kind="admin")
    token = await api.access_token(client["client"]["client_id"], client["client_secret"])
    added = await api.http.put(
        f"/v1/roles/policy_admin/members/{officer['id']}", headers=api.admin.headers
    )
    assert added.status_code == 200, added.text
    return {"Authorization": f"Bearer {token}"}


async def test_idp_admin_scopes_need_an_owner_approved_mapping(ext_api: Api, idp: FakeIdp) -> None:
    """Review item 4: a `manage:policy`-only admin mapped an IdP subject to a new user, gave it
    the policy admin and auditor roles, and that subject's IdP token (claiming every scope)
    read the audit log and registered an all-scope client acting as the owner."""
    officer = await _lower_admin(ext_api)
    mapped = await ext_api.http.post(
        "/v1/principals",
        json={"display_name": "idp admin", "external_issuer": IDP, "external_subject": SUBJECT},
        headers=officer,
    )
    assert mapped.status_code == 201, mapped.text
    principal_id = mapped.json()["id"]
    for path in (
        f"/v1/roles/policy_admin/members/{principal_id}",
        f"/v1/principals/{principal_id}/roles/auditor",
    ):
        await ext_api.http.put(path, headers=ext_api.admin.headers)
    every = "manage:policy read:audit manage:erasure run:jobs manage:tenant read:memory"
    token = sign(idp.es256, idp_claims(ext_api.tenant_id, scope=every))
    headers = {"Authorization": f"Bearer {token}"}
    assert (await ext_api.http.get("/v1/memories", headers=headers)).status_code == 200
    audit = await ext_api.http.get("/v1/audit/events", headers=headers)
    assert_problem(audit, 403, "insufficient-scope")
    minted = await ext_api.http.post(
        "/v1/clients",
        json={
            "principal_id": ext_api.admin.principal_id,
            "name": "escalate",
            "kind": "admin",
            "scopes": sorted(every.split()),
        },
        headers=headers,
    )
    assert_problem(minted, 403, "insufficient-scope")
    # The approval is the owner's: a lower admin cannot give it, nor to an unmapped principal.
    approve = f"/v1/roles/external_admin/members/{principal_id}"
    assert_problem(await ext_api.http.put(approve, headers=officer), 403, "insufficient-scope")
    plain = await ext_api.new_principal("plain")
    unmapped = await ext_api.http.put(
        f"/v1/roles/external_admin/members/{plain['id']}", headers=ext_api.admin.headers
    )
    assert_problem(unmapped, 422, "policy-name-invalid")
    clients = await ext_api.http.get("/v1/clients", headers=ext_api.admin.headers)
    assert [c["name"] for c in clients.json()["items"]] == ["bootstrap-admin", "agent"]
    # Once the owner approves, the IdP's admin scopes count (and removing it is the owner's).
    approved = await ext_api.http.put(approve, headers=ext_api.admin.headers)
    assert approved.status_code == 200, approved.text
    assert (await ext_api.http.get("/v1/audit/events", headers=headers)).status_code == 200
    revoke = await ext_api.http.delete(approve, headers=officer)
    assert_problem(revoke, 403, "insufficient-scope")
    revoked = await ext_api.http.delete(approve, headers=ext_api.admin.headers)
    assert revoked.status_code == 200, revoked.text
    again = await ext_api.http.get("/v1/audit/events", headers=headers)
    assert_problem(again, 403, "insufficient-scope")
