"""The red-team pass on tenant issuers (docs/security.md, "Red-team pass on tenant issuers"):
each test is a reproduction that succeeded before its fix. Every IdP is a real JWKS over HTTP on
127.0.0.1 (tests/integration/issuers/support.py)."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from service.auth.exchange import ACCESS_TOKEN_TYPE, TOKEN_EXCHANGE
from service.auth.scopes import ADMIN_SCOPES
from service.embeddings import Embedder
from tests.fixtures.api import Api
from tests.integration.auth.forge import assert_token_rejected, get_protected
from tests.integration.issuers.support import LoopbackIdp, issuer_app, mapped, register, serving
from tests.integration.memory.support import assert_problem, scalar

IDP = "https://login.acme.test"
AUD = "memgate-acme"
EVERY_ADMIN_SCOPE = " ".join(sorted(ADMIN_SCOPES))


@pytest.fixture
def real() -> Iterator[LoopbackIdp]:
    with serving(LoopbackIdp(IDP)) as idp:
        yield idp


@pytest.fixture
def evil() -> Iterator[LoopbackIdp]:
    """The same `iss`, a key only the narrow admin holds."""
    with serving(LoopbackIdp(IDP)) as idp:
        yield idp


@pytest.fixture
async def acme(database_url: str, tmp_path: Path, embedder: Embedder) -> AsyncIterator[Api]:
    async with issuer_app(database_url, tmp_path, embedder, tenant_issuer_cache_seconds=0) as api:
        yield api


def _headers(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def _admin_with(api: Api, scopes: list[str]) -> dict[str, str]:
    """A second policy admin whose admin client holds only `scopes`."""
    me = await api.new_principal("narrow-admin")
    made = await api.http.put(
        f"/v1/roles/policy_admin/members/{me['id']}", headers=api.admin.headers
    )
    assert made.status_code == 200, made.text
    created = await api.new_client(me["id"], scopes, kind="admin")
    client = created["client"]["client_id"]
    return _headers(await api.access_token(client, created["client_secret"]))


async def _approved_admin(api: Api, subject: str) -> dict[str, Any]:
    """The owner maps `subject` at IDP, approves it for admin scopes and makes it a policy admin
    and an auditor."""
    boss = await mapped(api, IDP, subject)
    for role in ("external_admin", "policy_admin"):
        added = await api.http.put(
            f"/v1/roles/{role}/members/{boss['id']}", headers=api.admin.headers
        )
        assert added.status_code == 200, added.text
    audits = await api.http.put(
        f"/v1/principals/{boss['id']}/roles/auditor", headers=api.admin.headers
    )
    assert audits.status_code == 200, audits.text
    return boss


async def _counts(api: Api) -> tuple[int, int]:
    issuers: int = await scalar(api.runtime, "SELECT count(*) FROM tenant_issuers")
    clients: int = await scalar(api.runtime, "SELECT count(*) FROM clients")
    return issuers, clients


# F1 ---------------------------------------------------------------------------------------


async def test_one_registration_per_issuer_per_tenant(acme: Api, real: LoopbackIdp) -> None:
    """A second audience for an issuer the tenant registered is refused, naming the one it has;
    another tenant may still register the issuer with an audience of its own."""
    created = await register(acme, issuer=IDP, audience=AUD, jwks_url=real.url)
    again = await acme.http.post(
        "/v1/issuers",
        json={"issuer": IDP, "audience": "other", "jwks_url": real.url},
        headers=acme.admin.headers,
    )
    problem = assert_problem(again, 409, "issuer-taken")
    assert created["id"] in problem["detail"]
    assert (await _counts(acme))[0] == 1
    globex = await acme.other_tenant()
    theirs = await register(globex, issuer=IDP, audience="memgate-globex", jwks_url=real.url)
    assert theirs["issuer"] == IDP
    assert created["id"] not in json.dumps(theirs)


async def test_a_policy_only_admin_cannot_add_its_own_key_for_an_approved_mapping(
    acme: Api, real: LoopbackIdp, evil: LoopbackIdp
) -> None:
    """Reproduction 1: the narrow admin registers the owner's `iss` with another audience and
    its own JWKS, then signs a token for the approved subject. Now: 409, and the forged token
    is refused; nothing was created."""
    await register(acme, issuer=IDP, audience=AUD, jwks_url=real.url)
    boss = await _approved_admin(acme, "boss-sub")
    narrow = await _admin_with(acme, ["manage:policy"])
    before = await _counts(acme)
    hijack = await acme.http.post(
        "/v1/issuers",
        headers=narrow,
        json={"issuer": IDP, "audience": "evil-aud", "jwks_url": evil.url, "algorithms": ["ES256"]},
    )
    assert_problem(hijack, 409, "issuer-taken")
    forged = evil.token("evil-aud", "boss-sub", scope=EVERY_ADMIN_SCOPE + " read:memory")
    assert_token_rejected(await acme.http.get("/v1/audit/events", headers=_headers(forged)), forged)
    minted = await acme.http.post(
        "/v1/clients",
        headers=_headers(forged),
        json={"principal_id": boss["id"], "name": "x", "kind": "admin", "scopes": ["read:audit"]},
    )
    assert minted.status_code == 401
    assert await _counts(acme) == before
    # The owner's real IdP still speaks for the approved admin.
    genuine = real.token(AUD, "boss-sub", scope="read:audit")
    assert (await acme.http.get("/v1/audit/events", headers=_headers(genuine))).status_code == 200


async def test_a_policy_only_admin_cannot_delete_and_reregister_a_mapped_issuer(
    acme: Api, real: LoopbackIdp, evil: LoopbackIdp
) -> None:
    """Reproduction 1, variant: delete the owner's registration and register the same pair with
    another JWKS. Deleting or registering an issuer that an approved admin is mapped to needs
    every admin scope, as approving the mapping did: 403, nothing changed."""
    created = await register(acme, issuer=IDP, audience=AUD, jwks_url=real.url)
    await _approved_admin(acme, "boss-sub")
    narrow = await _admin_with(acme, ["manage:policy", "manage:tenant"])
    refused = await acme.http.delete(f"/v1/issuers/{created['id']}", headers=narrow)
    problem = assert_problem(refused, 403, "insufficient-scope")
    assert "read:audit" in problem["detail"]
    assert (await _counts(acme))[0] == 1
    # Even once the owner deleted it, the narrow admin cannot bring in its own key.
    gone = await acme.http.delete(f"/v1/issuers/{created['id']}", headers=acme.admin.headers)
    assert gone.status_code == 204, gone.text
    body = {"issuer": IDP, "audience": AUD, "jwks_url": evil.url, "algorithms": ["ES256"]}
    again = await acme.http.post("/v1/issuers", headers=narrow, json=body)
    assert_problem(again, 403, "insufficient-scope")
    assert (await _counts(acme))[0] == 0
    forged = evil.token(AUD, "boss-sub", scope=EVERY_ADMIN_SCOPE)
    assert_token_rejected(await get_protected(acme.http, forged), forged)
    # The owner (every admin scope) may.
    assert (await register(acme, **body))["jwks_url"] == evil.url


async def test_an_issuer_principals_are_mapped_to_needs_manage_tenant(
    acme: Api, real: LoopbackIdp
) -> None:
    """Its tokens act as those principals (and read their memories), like a client acting as
    another principal: `manage:tenant` as well as `manage:policy`. An issuer nobody is mapped
    to needs only `manage:policy`, as before."""
    narrow = await _admin_with(acme, ["manage:policy"])
    body = {"issuer": IDP, "audience": AUD, "jwks_url": real.url}
    created = await acme.http.post("/v1/issuers", headers=narrow, json=body)
    assert created.status_code == 201, created.text
    await mapped(acme, IDP, "plain-user")
    refused = await acme.http.delete(f"/v1/issuers/{created.json()['id']}", headers=narrow)
    assert assert_problem(refused, 403, "insufficient-scope")["required_scope"] == ("manage:tenant")
    assert (await _counts(acme))[0] == 1
    wider = await _admin_with(acme, ["manage:policy", "manage:tenant"])
    gone = await acme.http.delete(f"/v1/issuers/{created.json()['id']}", headers=wider)
    assert gone.status_code == 204, gone.text
    again = await acme.http.post("/v1/issuers", headers=narrow, json=body)
    assert assert_problem(again, 403, "insufficient-scope")["required_scope"] == "manage:tenant"
    assert (await acme.http.post("/v1/issuers", headers=wider, json=body)).status_code == 201


# F2 ---------------------------------------------------------------------------------------


async def test_a_decoy_registration_cannot_unlock_the_last_admins_issuer(
    acme: Api, real: LoopbackIdp
) -> None:
    """Reproduction 2: register a decoy with the same `iss` and a dead JWKS, then delete the
    registration the last working admin logs in through. Now the decoy is refused and the
    delete is 409: the IdP admin still manages the tenant."""
    created = await register(acme, issuer=IDP, audience=AUD, jwks_url=real.url)
    await _approved_admin(acme, "idp-admin")
    disabled = await acme.http.post(
        f"/v1/clients/{acme.admin.client_id}/disable", headers=acme.admin.headers
    )
    assert disabled.status_code == 200, disabled.text
    headers = _headers(real.token(AUD, "idp-admin", scope=EVERY_ADMIN_SCOPE))
    decoy = await acme.http.post(
        "/v1/issuers",
        headers=headers,
        json={"issuer": IDP, "audience": "never-issued", "jwks_url": "http://127.0.0.1:1/none"},
    )
    assert_problem(decoy, 409, "issuer-taken")
    refused = await acme.http.delete(f"/v1/issuers/{created['id']}", headers=headers)
    assert_problem(refused, 409, "last-role-holder")
    listed = await acme.http.get("/v1/issuers", headers=headers)
    assert [item["id"] for item in listed.json()["items"]] == [created["id"]]


# F3 ---------------------------------------------------------------------------------------


async def test_a_delegated_token_stops_with_its_subjects_issuer(
    acme: Api, real: LoopbackIdp
) -> None:
    """Reproduction 3: an agent's exchanged token for an IdP user kept working after the IdP's
    registration was deleted (and after it was registered again, under a new id)."""
    created = await register(acme, issuer=IDP, audience=AUD, jwks_url=real.url)
    user = await mapped(acme, IDP, "ursula")
    user_token = real.token(AUD, "ursula", scope="read:memory write:memory manage:delegates")
    bot = await acme.new_principal("bot", kind="agent")
    client = await acme.new_client(bot["id"], ["read:memory", "write:memory"])
    allowed = await acme.http.put(
        f"/v1/principals/{user['id']}/delegates/{bot['id']}", headers=_headers(user_token)
    )
    assert allowed.status_code in (200, 201, 204), allowed.text
    exchanged = await acme.http.post(
        "/oauth/token",
        data={
            "grant_type": TOKEN_EXCHANGE,
            "subject_token": user_token,
            "subject_token_type": ACCESS_TOKEN_TYPE,
        },
        auth=(client["client"]["client_id"], client["client_secret"]),
    )
    assert exchanged.status_code == 200, exchanged.text
    delegated = exchanged.json()["access_token"]
    assert (await get_protected(acme.http, delegated)).status_code == 200
    gone = await acme.http.delete(f"/v1/issuers/{created['id']}", headers=acme.admin.headers)
    assert gone.status_code == 204, gone.text
    assert_token_rejected(await get_protected(acme.http, delegated), delegated)
    await register(acme, issuer=IDP, audience=AUD, jwks_url=real.url)
    assert (await get_protected(acme.http, user_token)).status_code == 200
    assert_token_rejected(await get_protected(acme.http, delegated), delegated)


# F4 ---------------------------------------------------------------------------------------


def _junk(iss_json: str, aud_json: str, alg: str = "ES256", kid: str | None = "k1") -> str:
    def part(raw: str) -> str:
        return base64.urlsafe_b64encode(raw.encode()).rstrip(b"=").decode()

    now = int(time.time())
    body = f'{{"iss": {iss_json}, "aud": {aud_json}, "sub": "x", "iat": {now}, "exp": {now + 60}}}'
    header = {"alg": alg, "typ": "at+jwt"} | ({"kid": kid} if kid else {})
    return f"{part(json.dumps(header))}.{part(body)}.AAAA"


@pytest.mark.parametrize(
    ("iss", "aud"),
    [
        ('"https://x\\ud800"', '"a"'),
        ('"https://x"', '["\\udfff"]'),
        ('"https://x"', '"\\udfff"'),
        ('"https://x\\u0000"', '"a"'),
        ('"https://x"', '"a\\u0000"'),
    ],
)
async def test_junk_iss_and_aud_are_an_ordinary_401_and_audited(
    acme: Api, iss: str, aud: str
) -> None:
    """Reproduction 4: a lone surrogate in `aud` answered 500, in `iss` 503 (the audit row
    could not be written). Now an ordinary 401, audited on the platform chain."""
    before: int = await scalar(acme.runtime, "SELECT count(*) FROM audit_events")
    token = _junk(iss, aud)
    response = await get_protected(acme.http, token)
    assert_token_rejected(response, token)
    assert "untrusted issuer" in response.json()["detail"]
    after: int = await scalar(acme.runtime, "SELECT count(*) FROM audit_events")
    assert after == before + 1
    assert (await acme.http.get("/v1/memories", headers=acme.admin.headers)).status_code == 200


# F6 ---------------------------------------------------------------------------------------


async def test_one_wording_for_every_failure_once_a_registered_pair_is_picked(
    acme: Api, real: LoopbackIdp
) -> None:
    """Reproduction 6: the 401 told an unauthenticated prober the registration's algorithms,
    which key ids its JWKS holds and whether it answers. Now one wording (the precise reason is
    in the log and in the audit row's reason only)."""
    globex = await acme.other_tenant()
    await register(
        globex, issuer=IDP, audience="memgate-globex", jwks_url=real.url, algorithms=["ES256"]
    )
    dead = "https://login.dead.test"
    await register(globex, issuer=dead, audience="memgate-globex", jwks_url="http://127.0.0.1:1/x")
    probes = {
        "alg RS256": _junk(json.dumps(IDP), '"memgate-globex"', alg="RS256"),
        "alg EdDSA": _junk(json.dumps(IDP), '"memgate-globex"', alg="EdDSA"),
        "no kid": _junk(json.dumps(IDP), '"memgate-globex"', kid=None),
        "known kid, bad signature": _junk(json.dumps(IDP), '"memgate-globex"', kid="k1"),
        "unknown kid": _junk(json.dumps(IDP), '"memgate-globex"', kid="k2"),
        "dead JWKS": _junk(json.dumps(dead), '"memgate-globex"'),
    }
    details = {}
    with structlog.testing.capture_logs() as logs:
        for name, token in probes.items():
            response = await get_protected(acme.http, token)
            assert_token_rejected(response, token)
            details[name] = response.json()["detail"]
    assert len(set(details.values())) == 1, details
    assert "untrusted issuer" not in next(iter(details.values()))
    reasons = {e.get("reason") for e in logs if e.get("event") == "token_rejected"}
    assert {"algorithm not allowed for this issuer", "unknown key id"} <= reasons, logs
    rows = await scalar(
        acme.runtime,
        "SELECT count(*) FROM audit_events WHERE reason LIKE 'unauthenticated:%'",
    )
    assert rows == len(probes)
    unregistered = _junk(json.dumps(IDP), '"guess"')
    assert "untrusted issuer" in (await get_protected(acme.http, unregistered)).json()["detail"]
