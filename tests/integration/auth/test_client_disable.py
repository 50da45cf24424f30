"""Disabling a client stops its live tokens on the very next request and refuses new ones."""

from __future__ import annotations

from service.runtime import Runtime
from tests.fixtures.api import Api
from tests.integration.auth.forge import assert_token_rejected, get_protected


async def test_disabled_client_token_is_refused_at_once(api: Api, runtime: Runtime) -> None:
    alice = await api.new_agent("alice")
    bob = await api.new_agent("bob")
    assert (await get_protected(api.http, alice.token)).status_code == 200
    assert (await get_protected(api.http, bob.token)).status_code == 200

    disabled = await api.http.post(
        f"/v1/clients/{alice.client_id}/disable", headers=api.admin.headers
    )
    assert disabled.status_code == 200, disabled.text
    assert disabled.json()["disabled_at"] is not None

    # The very next request with the already-issued, unexpired token: 401.
    assert_token_rejected(await get_protected(api.http, alice.token), alice.token)
    write = await api.http.post(
        "/v1/memories",
        json={"subject": "service:billing", "kind": "fact", "key": "k", "value": "v"},
        headers=alice.headers,
    )
    assert_token_rejected(write, alice.token)

    # No new token either.
    refused = await api.token_response(alice.client_id, alice.secret)
    assert refused.status_code == 401, refused.text
    assert refused.json()["error"] == "invalid_client"
    assert alice.secret not in refused.text

    # Other clients are unaffected.
    assert (await get_protected(api.http, bob.token)).status_code == 200
    assert (await api.token_response(bob.client_id, bob.secret)).status_code == 200


async def test_disabling_a_client_of_another_tenant_is_not_found(api: Api) -> None:
    globex = await api.other_tenant("globex")
    bob = await globex.new_agent("bob")
    response = await api.http.post(
        f"/v1/clients/{bob.client_id}/disable", headers=api.admin.headers
    )
    assert response.status_code == 404, response.text
    assert (await get_protected(api.http, bob.token)).status_code == 200


async def test_disabling_needs_manage_policy(api: Api) -> None:
    alice = await api.new_agent("alice")
    response = await api.http.post(f"/v1/clients/{alice.client_id}/disable", headers=alice.headers)
    assert response.status_code == 403, response.text
    assert (await get_protected(api.http, alice.token)).status_code == 200
