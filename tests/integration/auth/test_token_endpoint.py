"""The embedded authorization server: client authentication, scope narrowing, what a token holds,
and the public JWKS and metadata documents."""

from __future__ import annotations

import base64
import json
import time
import uuid
from typing import Any

from joserfc import jwt
from joserfc.jwk import KeySet, KeySetSerialization
from sqlalchemy import select

from service.db.models import Client
from service.db.tenancy import name_tenant
from service.runtime import Runtime
from tests.fixtures.api import Api, TestClient
from tests.integration.auth.forge import assert_oauth_error, get_protected, unverified_header

PRIVATE_JWK_MEMBERS = ("d", "p", "q", "dp", "dq", "qi", "k", "oth")


async def test_wrong_secret_is_invalid_client(api: Api) -> None:
    alice = await api.new_agent("alice")
    wrong = alice.secret[:-4] + "XXXX"
    response = await api.token_response(alice.client_id, wrong)
    assert_oauth_error(response, 401, "invalid_client", wrong)
    assert alice.secret not in response.text
    assert response.headers["www-authenticate"].lower().startswith("basic")
    empty = await api.token_response(alice.client_id, "")
    assert_oauth_error(empty, 401, "invalid_client", "")


async def test_wrong_secret_via_post_body_is_invalid_client(api: Api) -> None:
    alice = await api.new_agent("alice")
    response = await api.http.post(
        "/oauth/token",
        data={
            "grant_type": "client_credentials",
            "client_id": alice.client_id,
            "client_secret": "mgs_wrong",
        },
    )
    assert_oauth_error(response, 401, "invalid_client", "mgs_wrong")


async def test_unknown_client_is_invalid_client(api: Api) -> None:
    for client_id in (str(uuid.uuid4()), "nobody", "' OR 1=1 --", ""):
        response = await api.token_response(client_id, "mgs_whatever")
        assert_oauth_error(response, 401, "invalid_client", "mgs_whatever")


async def test_another_clients_secret_is_invalid_client(api: Api) -> None:
    alice = await api.new_agent("alice")
    bob = await api.new_agent("bob")
    response = await api.token_response(alice.client_id, bob.secret)
    assert_oauth_error(response, 401, "invalid_client", bob.secret)


async def test_client_secret_is_stored_as_argon2id_hash(api: Api, runtime: Runtime) -> None:
    principal = await api.new_principal("alice")
    created = await api.new_client(principal["id"], ["read:memory"])
    client_id, secret = created["client"]["client_id"], created["client_secret"]
    assert secret
    async with runtime.sessionmaker() as session:
        await name_tenant(
            session, uuid.UUID(api.tenant_id)
        )  # row-level security: no tenant, no rows
        stored = await session.scalar(
            select(Client.secret_hash).where(Client.client_id == uuid.UUID(client_id))
        )
    assert stored is not None
    assert stored.startswith("$argon2id$")
    assert secret not in stored
    assert secret[4:] not in stored  # not even without the "mgs_" prefix
    listed = await api.http.get(f"/v1/clients/{client_id}", headers=api.admin.headers)
    assert listed.status_code == 200
    assert secret not in listed.text
    assert "secret" not in listed.json()


async def test_scopes_are_narrowed_to_the_registration(api: Api) -> None:
    principal = await api.new_principal("alice")
    created = await api.new_client(principal["id"], ["read:memory", "write:memory"])
    client_id, secret = created["client"]["client_id"], created["client_secret"]
    response = await api.token_response(client_id, secret, "read:memory write:memory delete:memory")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["scope"] == "read:memory write:memory"
    claims = jwt.decode(body["access_token"], await _jwks(api.http)).claims
    assert claims["scope"] == "read:memory write:memory"
    # A subset asked is a subset granted.
    narrow = await api.token_response(client_id, secret, "read:memory")
    assert narrow.json()["scope"] == "read:memory"
    # The narrowed token really lacks delete.
    token = body["access_token"]
    headers = {"Authorization": f"Bearer {token}"}
    forbidden = await api.http.delete(f"/v1/memories/{uuid.uuid4()}", headers=headers)
    assert forbidden.status_code == 403


async def test_agent_client_cannot_be_registered_with_admin_scopes(api: Api) -> None:
    principal = await api.new_principal("alice")
    for scopes in (["manage:policy"], ["read:memory", "manage:policy"], ["read:audit"]):
        response = await api.http.post(
            "/v1/clients",
            json={"principal_id": principal["id"], "name": "a", "kind": "agent", "scopes": scopes},
            headers=api.admin.headers,
        )
        assert response.status_code == 422, response.text
        assert response.headers["content-type"].startswith("application/problem+json")
        assert response.json()["type"].endswith("/scope-not-allowed")
    unknown = await api.http.post(
        "/v1/clients",
        json={"principal_id": principal["id"], "name": "a", "scopes": ["root:everything"]},
        headers=api.admin.headers,
    )
    assert unknown.status_code == 422
    assert unknown.json()["type"].endswith("/scope-not-allowed")


async def test_admin_client_token_may_hold_admin_scopes(api: Api) -> None:
    principal = await api.new_principal("ops")
    # Listing principals needs the policy admin grant besides the scope.
    made = await api.http.put(
        f"/v1/roles/policy_admin/members/{principal['id']}", headers=api.admin.headers
    )
    assert made.status_code == 200, made.text
    created = await api.new_client(principal["id"], ["manage:policy", "read:memory"], kind="admin")
    client_id, secret = created["client"]["client_id"], created["client_secret"]
    response = await api.token_response(client_id, secret, "manage:policy")
    assert response.status_code == 200, response.text
    assert response.json()["scope"] == "manage:policy"
    token = response.json()["access_token"]
    listed = await api.http.get("/v1/principals", headers={"Authorization": f"Bearer {token}"})
    assert listed.status_code == 200, listed.text
    # The bootstrap admin client holds it too.
    bootstrap = await api.token_response(api.admin.client_id, api.admin.secret, "manage:policy")
    assert bootstrap.json()["scope"] == "manage:policy"


async def test_agent_asking_for_admin_scope_gets_none_of_it(api: Api) -> None:
    alice = await api.new_agent("alice", scopes=("read:memory",))
    mixed = await api.token_response(alice.client_id, alice.secret, "read:memory manage:policy")
    assert mixed.status_code == 200, mixed.text
    assert mixed.json()["scope"] == "read:memory"
    only_admin = await api.token_response(alice.client_id, alice.secret, "manage:policy")
    assert_oauth_error(only_admin, 400, "invalid_scope", alice.secret)


async def test_no_scope_requested_grants_all_registered_scopes(api: Api) -> None:
    alice = await api.new_agent("alice", scopes=("read:memory", "write:memory"))
    response = await api.token_response(alice.client_id, alice.secret)
    assert response.status_code == 200, response.text
    assert response.json()["scope"] == "read:memory write:memory"
    empty = await api.token_response(alice.client_id, alice.secret, "")
    assert empty.status_code == 200, empty.text
    assert empty.json()["scope"] == "read:memory write:memory"


async def test_nothing_grantable_is_invalid_scope(api: Api) -> None:
    alice = await api.new_agent("alice", scopes=("read:memory",))
    for scope in ("delete:memory", "write:memory delete:memory", "no:such-scope"):
        response = await api.token_response(alice.client_id, alice.secret, scope)
        assert_oauth_error(response, 400, "invalid_scope", alice.secret)


async def test_issued_token_carries_every_claim(api: Api, runtime: Runtime) -> None:
    alice = await api.new_agent("alice", scopes=("read:memory", "write:memory"))
    before = int(time.time())
    response = await api.token_response(alice.client_id, alice.secret)
    after = int(time.time())
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["token_type"] == "Bearer"
    assert body["expires_in"] == 600
    assert response.headers["cache-control"] == "no-store"
    token = body["access_token"]

    header = unverified_header(token)
    assert header["typ"] == "at+jwt"
    assert header["alg"] == "ES256"
    assert isinstance(header["kid"], str)
    assert header["kid"]
    assert not {"jwk", "jku", "x5u", "x5c"} & set(header)

    decoded = jwt.decode(token, await _jwks(api.http), algorithms=["ES256"])
    claims = decoded.claims
    assert claims["iss"] == runtime.settings.server.public_url
    assert claims["aud"] == runtime.settings.auth.audience == "memgate"
    assert claims["tenant"] == api.tenant_id
    assert claims["sub"] == alice.principal_id
    assert claims["client_id"] == alice.client_id
    assert claims["scope"] == "read:memory write:memory"
    assert isinstance(claims["jti"], str)
    assert len(claims["jti"]) >= 16
    assert before <= claims["iat"] <= after
    assert claims["exp"] - claims["iat"] == 600
    # Two tokens never share a jti.
    again = jwt.decode(await api.access_token(alice.client_id, alice.secret), await _jwks(api.http))
    assert again.claims["jti"] != claims["jti"]
    # And the token works.
    assert (await get_protected(api.http, token)).status_code == 200


async def test_client_secret_post_works(api: Api) -> None:
    alice = await api.new_agent("alice", scopes=("read:memory",))
    response = await api.http.post(
        "/oauth/token",
        data={
            "grant_type": "client_credentials",
            "client_id": alice.client_id,
            "client_secret": alice.secret,
            "scope": "read:memory",
        },
    )
    assert response.status_code == 200, response.text
    token = response.json()["access_token"]
    assert response.json()["scope"] == "read:memory"
    assert (await get_protected(api.http, token)).status_code == 200


async def test_client_secret_basic_with_url_encoded_credentials_works(api: Api) -> None:
    alice = await api.new_agent("alice", scopes=("read:memory",))
    credentials = base64.b64encode(f"{alice.client_id}:{alice.secret}".encode()).decode()
    response = await api.http.post(
        "/oauth/token",
        data={"grant_type": "client_credentials"},
        headers={"Authorization": f"Basic {credentials}"},
    )
    assert response.status_code == 200, response.text


async def test_unsupported_grant_type_is_refused(api: Api) -> None:
    alice = await api.new_agent("alice")
    response = await api.http.post(
        "/oauth/token", data={"grant_type": "password"}, auth=(alice.client_id, alice.secret)
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"] == "unsupported_grant_type"
    assert "access_token" not in response.json()


async def test_jwks_lists_the_token_kid_without_private_members(
    http: TestClient,
    api: Api,
) -> None:
    token = api.admin.token
    kid = unverified_header(token)["kid"]
    response = await http.get("/.well-known/jwks.json")
    assert response.status_code == 200
    document = response.json()
    kids = [key["kid"] for key in document["keys"]]
    assert kid in kids
    assert len(kids) == len(set(kids)) >= 2  # active and the published next key
    for key in document["keys"]:
        for member in PRIVATE_JWK_MEMBERS:
            assert member not in key, (member, key["kid"])
        assert key["kty"] == "EC"
        assert key["crv"] == "P-256"
    assert '"d"' not in response.text
    # The published keys verify the token.
    jwt.decode(token, KeySet.import_key_set(document), algorithms=["ES256"])


async def test_authorization_server_metadata(
    http: TestClient,
    runtime: Runtime,
) -> None:
    response = await http.get("/.well-known/oauth-authorization-server")
    assert response.status_code == 200
    metadata = response.json()
    issuer = runtime.settings.server.public_url
    assert metadata["issuer"] == issuer
    assert metadata["token_endpoint"] == f"{issuer}/oauth/token"
    assert metadata["jwks_uri"] == f"{issuer}/.well-known/jwks.json"
    assert "client_credentials" in metadata["grant_types_supported"]
    assert set(metadata["token_endpoint_auth_methods_supported"]) == {
        "client_secret_basic",
        "client_secret_post",
    }


async def _jwks(http: Any) -> KeySet:
    response = await http.get("/.well-known/jwks.json")
    assert response.status_code == 200
    document: KeySetSerialization = json.loads(response.text)
    return KeySet.import_key_set(document)
