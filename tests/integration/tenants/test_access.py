"""Who may call /v1/tenants: nobody without a token (401), no token without `manage:tenant`
(403 naming it), no tenant admin (403 platform-admin-required, before any lookup: the same bytes
for its own tenant, another one and an unknown id), and for the platform admin an unknown or
retired id is the same 404. Nothing a refused call sends changes anything."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.fixtures.api import Api
from tests.integration.memory.support import as_owner, assert_problem
from tests.integration.tenants.support import TENANT_ROUTES, TenantRoute, platform, send


async def _tenants_state(api: Api) -> list[Any]:
    async with as_owner(api.runtime) as conn:
        rows = await conn.exec_driver_sql(
            "SELECT tenant_id, name, disabled_at, retired_at, settings::text FROM tenants "
            "ORDER BY tenant_id"
        )
        return [tuple(row) for row in rows]


@pytest.mark.parametrize("route", TENANT_ROUTES, ids=str)
async def test_no_token_is_401(api: Api, route: TenantRoute) -> None:
    before = await _tenants_state(api)
    for token in (None, "not.a.jwt"):
        response = await send(api, route, api.tenant_id, token)
        assert_problem(response, 401, "unauthenticated")
        assert response.headers["www-authenticate"].startswith("Bearer ")
    assert await _tenants_state(api) == before


@pytest.mark.parametrize("route", TENANT_ROUTES, ids=str)
async def test_missing_scope_is_403_naming_it(api: Api, route: TenantRoute) -> None:
    admin = await platform(api)
    narrowed = await admin.access_token(admin.admin.client_id, admin.admin.secret, "manage:policy")
    agent = await admin.new_agent("bot")
    before = await _tenants_state(api)
    for token in (narrowed, agent.token):
        response = await send(api, route, api.tenant_id, token)
        problem = assert_problem(response, 403, "insufficient-scope")
        assert problem["required_scope"] == "manage:tenant"
    assert await _tenants_state(api) == before


@pytest.mark.parametrize("route", TENANT_ROUTES, ids=str)
async def test_a_tenant_admin_is_no_platform_admin(api: Api, route: TenantRoute) -> None:
    """A tenant admin's token holds `manage:tenant` (in its own tenant) and is refused the same
    way whatever id it names: its own tenant's, another's, the platform's or none."""
    other = await api.other_tenant()
    admin = await platform(api)
    assert (
        "manage:tenant"
        in (await api.token_response(api.admin.client_id, api.admin.secret)).json()["scope"].split()
    )
    before = await _tenants_state(api)
    answers = []
    for tenant_id in (api.tenant_id, other.tenant_id, admin.tenant_id, str(uuid.uuid4())):
        response = await send(api, route, tenant_id, api.admin.token)
        problem = assert_problem(response, 403, "platform-admin-required")
        assert tenant_id not in problem["detail"]
        answers.append(response.content.replace(tenant_id.encode(), b"{id}"))
    assert len(set(answers)) == 1
    assert await _tenants_state(api) == before


PROVES_RETIRED = "/v1/tenants/{id}/proof"
"""The one tenant route made for a retired (deleted) tenant: its erasure's proof
(tests/integration/erasure/test_tenant_deletion.py); an unknown id is 404 there too."""


@pytest.mark.parametrize(
    "route", [r for r in TENANT_ROUTES if r.takes_id and r.template != PROVES_RETIRED], ids=str
)
async def test_unknown_and_retired_ids_are_the_same_404(api: Api, route: TenantRoute) -> None:
    admin = await platform(api)
    retired = await api.other_tenant("to-be-retired")
    token = admin.admin.token
    assert (
        await admin.http.post(
            f"/v1/tenants/{retired.tenant_id}/disable", headers=admin.admin.headers
        )
    ).status_code == 200
    plan = (
        await admin.http.delete(f"/v1/tenants/{retired.tenant_id}", headers=admin.admin.headers)
    ).json()
    done = await admin.http.delete(
        f"/v1/tenants/{retired.tenant_id}",
        params={"confirm": plan["confirm"]},
        headers=admin.admin.headers,
    )
    assert done.status_code == 200, done.text
    before = await _tenants_state(api)
    fresh = str(uuid.uuid4())
    baseline = await send(api, route, fresh, token)
    assert_problem(baseline, 404, "tenant-not-found")
    expected = baseline.content.replace(fresh.encode(), b"{id}")
    for tenant_id in (str(uuid.uuid4()), retired.tenant_id):
        response = await send(api, route, tenant_id, token)
        assert response.content.replace(tenant_id.encode(), b"{id}") == expected
        assert response.headers["content-length"] == baseline.headers["content-length"]
    assert await _tenants_state(api) == before
