"""Disabling a tenant bites on the very next request, for every kind of token: an agent's, a
delegated (token-exchange) one and an external IdP's; the token endpoint refuses its clients
with the same answer as a disabled client's. Enabling restores them; another tenant never
notices."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from service.auth.exchange import ACCESS_TOKEN_TYPE, TOKEN_EXCHANGE
from service.embeddings import Embedder
from tests.fixtures.api import MEMORY_SCOPES, Agent, Api
from tests.integration.auth.external_idp import (
    IDP,
    SUBJECT,
    FakeIdp,
    idp_app,
    idp_claims,
)
from tests.integration.auth.forge import assert_token_rejected, get_protected, sign
from tests.integration.tenants.support import platform


async def _set(admin: Api, tenant_id: str, action: str) -> None:
    response = await admin.http.post(
        f"/v1/tenants/{tenant_id}/{action}", headers=admin.admin.headers
    )
    assert response.status_code == 200, response.text
    assert (response.json()["disabled_at"] is None) == (action == "enable")


async def _delegated(api: Api) -> str:
    user = await api.new_agent("ursula", scopes=(*MEMORY_SCOPES, "manage:delegates"))
    bot = await api.new_principal("helper-bot", kind="agent")
    created = await api.new_client(bot["id"], ["read:memory"])
    agent = Agent(bot["id"], created["client"]["client_id"], created["client_secret"], "")
    allowed = await api.http.put(
        f"/v1/principals/{user.principal_id}/delegates/{agent.principal_id}", headers=user.headers
    )
    assert allowed.status_code in (200, 201, 204), allowed.text
    exchanged = await api.http.post(
        "/oauth/token",
        data={
            "grant_type": TOKEN_EXCHANGE,
            "subject_token": user.token,
            "subject_token_type": ACCESS_TOKEN_TYPE,
        },
        auth=(agent.client_id, agent.secret),
    )
    assert exchanged.status_code == 200, exchanged.text
    token: str = exchanged.json()["access_token"]
    return token


async def test_disable_stops_agent_and_delegated_tokens_on_the_next_request(api: Api) -> None:
    admin = await platform(api)
    other = await api.other_tenant()
    outsider = await other.new_agent("carol")
    agent = await api.new_agent("alice")
    delegated = await _delegated(api)
    tokens = {"agent": agent.token, "delegated": delegated, "admin": api.admin.token}
    for token in tokens.values():
        assert (await get_protected(api.http, token)).status_code == 200
    await _set(admin, api.tenant_id, "disable")
    for token in tokens.values():
        response = await get_protected(api.http, token)
        assert_token_rejected(response, token)
    # Idempotent, and the first disable's time stays.
    first = (
        await admin.http.get(f"/v1/tenants/{api.tenant_id}", headers=admin.admin.headers)
    ).json()
    await _set(admin, api.tenant_id, "disable")
    again = (
        await admin.http.get(f"/v1/tenants/{api.tenant_id}", headers=admin.admin.headers)
    ).json()
    assert again["disabled_at"] == first["disabled_at"]
    # Another tenant is unaffected.
    assert (await get_protected(other.http, outsider.token)).status_code == 200
    await _set(admin, api.tenant_id, "enable")
    for token in tokens.values():
        assert (await get_protected(api.http, token)).status_code == 200


async def test_the_token_endpoint_refuses_a_disabled_tenants_clients_like_a_disabled_client(
    api: Api,
) -> None:
    admin = await platform(api)
    other = await api.other_tenant()
    agent = await api.new_agent("alice")
    stopped = await other.new_agent("bob")
    off = await other.http.post(
        f"/v1/clients/{stopped.client_id}/disable", headers=other.admin.headers
    )
    assert off.status_code == 200, off.text
    disabled_client = await other.token_response(stopped.client_id, stopped.secret)
    await _set(admin, api.tenant_id, "disable")
    for client_id, secret in (
        (agent.client_id, agent.secret),
        (api.admin.client_id, api.admin.secret),
    ):
        refused = await api.token_response(client_id, secret)
        assert refused.status_code == disabled_client.status_code == 401
        assert refused.content.replace(client_id.encode(), b"{id}") == (
            disabled_client.content.replace(stopped.client_id.encode(), b"{id}")
        )
    await _set(admin, api.tenant_id, "enable")
    assert await api.access_token(agent.client_id, agent.secret)


@pytest.fixture
async def ext_api(
    database_url: str, tmp_path: Path, embedder: Embedder, idp: FakeIdp
) -> AsyncIterator[Api]:
    async with idp_app(database_url, tmp_path, embedder, idp) as api:
        yield api


async def test_disable_stops_external_idp_tokens_on_the_next_request(
    ext_api: Api, idp: FakeIdp
) -> None:
    admin = await platform(ext_api)
    await ext_api.new_principal(
        "external user", kind="user", external_issuer=IDP, external_subject=SUBJECT
    )
    token = sign(idp.es256, idp_claims(ext_api.tenant_id))
    assert (await get_protected(ext_api.http, token)).status_code == 200
    await _set(admin, ext_api.tenant_id, "disable")
    assert_token_rejected(await get_protected(ext_api.http, token), token)
    await _set(admin, ext_api.tenant_id, "enable")
    response: httpx.Response = await get_protected(ext_api.http, token)
    assert response.status_code == 200, response.text
