"""External-IdP tokens are limited by their tenant's limits; the IdP's own `client_id` values
never select one of our clients' buckets (an IdP could otherwise name a victim client)."""

from __future__ import annotations

from tests.fixtures.api import Api
from tests.integration.auth.external_idp import (
    IDP,
    FakeIdp,
    idp_claims,
)
from tests.integration.auth.forge import get_protected, sign
from tests.integration.quotas.support import assert_limited, limit


async def test_an_external_token_spends_the_tenant_bucket_never_a_named_client_s(
    ext_api: Api,
    idp: FakeIdp,
) -> None:
    await ext_api.new_principal(
        "external user", kind="user", external_issuer=IDP, external_subject="ext-user-1"
    )
    alice = await ext_api.new_agent("alice")
    # The IdP names alice's client id in its token: alice's own (tight) limit must not apply,
    # and alice must not pay for the IdP's calls.
    token = sign(idp.es256, idp_claims(ext_api.tenant_id, client_id=alice.client_id))
    await limit(
        ext_api.runtime,
        ext_api.tenant_id,
        alice.client_id,
        requests_per_second=0.001,
        request_burst=1,
    )
    for _ in range(3):
        assert (await get_protected(ext_api.http, token)).status_code == 200
    assert (await ext_api.http.get("/v1/memories", headers=alice.headers)).status_code == 200
    # The tenant's limit covers external tokens like any other.
    await limit(ext_api.runtime, ext_api.tenant_id, requests_per_second=0.001, request_burst=2)
    assert (await get_protected(ext_api.http, token)).status_code == 200
    assert (await get_protected(ext_api.http, token)).status_code == 200
    assert_limited(await get_protected(ext_api.http, token), "tenant-requests", 2)
