"""Access matrix of every /v1 route: 401 without a token, 403 without the route's scope, and
404 (indistinguishable from a random id) for another tenant's or another principal's resource.
A route added to the app without a row in the table fails `test_route_table_covers_every_route`
(the policy API's routes have their own table and access tests in tests/integration/policy, the
platform's /v1/tenants routes theirs in tests/integration/tenants/test_access.py, the job
runner's in tests/integration/jobs/test_api.py, the erasure API's in
tests/integration/erasure/test_access_and_state.py). The
cross-tenant matrix of every route and MCP tool (ids in paths, filters and bodies, names, the
other tenant's tokens; audit chains and logs) is tests/integration/tenants.
"""

from __future__ import annotations

import re

import pytest

from tests.fixtures.api import Api, TestClient
from tests.integration.erasure.test_access_and_state import ERASURE_ROUTES
from tests.integration.jobs.test_api import JOB_ROUTES
from tests.integration.memory import matrix
from tests.integration.memory.support import ID_ROUTES, ROUTES, Route
from tests.integration.policy.test_policy_api import POLICY_ROUTES
from tests.integration.tenants.support import TENANT_ROUTES

PUBLIC_ROUTES = ("/healthz", "/readyz", "/schema/openapi.json")
"""Routes outside /v1 that answer without a token (probes and the spec; metrics have a listener
of their own)."""


@pytest.mark.parametrize("path", PUBLIC_ROUTES)
async def test_public_routes_need_no_token(http: TestClient, path: str) -> None:
    response = await http.get(path)
    assert response.status_code == 200, response.text
    assert "www-authenticate" not in response.headers


@pytest.mark.parametrize("route", ROUTES, ids=str)
async def test_no_token_is_401_with_challenge(
    http: TestClient,
    route: Route,
) -> None:
    await matrix.check_unauthenticated(http, route)


@pytest.mark.parametrize("route", ROUTES, ids=str)
async def test_missing_scope_is_403_naming_it(api: Api, route: Route) -> None:
    await matrix.check_insufficient_scope(api, route)


@pytest.mark.parametrize("route", ID_ROUTES, ids=str)
async def test_foreign_id_is_404_like_a_random_id(api: Api, route: Route) -> None:
    await matrix.check_cross_tenant_not_found(api, route)


@pytest.mark.parametrize("route", ROUTES, ids=str)
async def test_the_route_scope_alone_is_enough(api: Api, route: Route) -> None:
    await matrix.check_minimal_scope(api, route)


def _one_role(path: str) -> str:
    """Role routes are listed for the one role there is."""
    return path.replace("/roles/{role:str}", "/roles/auditor") if "/principals/" in path else path


def test_route_table_covers_every_route() -> None:
    from service.app import create_app

    declared = {
        (method, re.sub(r"\{\w+:str\}", "{id}", _one_role(route.path)).rstrip("/"))
        for route in create_app().routes
        if route.path.startswith("/v1/")
        for method in getattr(route, "methods", ())
        if method not in {"HEAD", "OPTIONS"}
    }
    policy_api = {(method, template) for method, template, _ in POLICY_ROUTES}
    platform_api = {(route.method, route.template) for route in TENANT_ROUTES}
    job_api = set(JOB_ROUTES)
    erasure_api = set(ERASURE_ROUTES)
    assert erasure_api <= declared
    assert platform_api <= declared
    assert job_api <= declared
    assert declared - policy_api - platform_api - job_api - erasure_api == {
        (route.method, route.template) for route in ROUTES
    }
