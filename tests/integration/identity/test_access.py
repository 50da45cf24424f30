"""Access matrix of the admin routes (scope manage:policy, which agents never hold)."""

from __future__ import annotations

import pytest
from litestar.testing import AsyncTestClient

from tests.fixtures.api import Api
from tests.integration.memory import matrix
from tests.integration.memory.support import ADMIN_ROUTES, ID_ROUTES, Route

ADMIN_ID_ROUTES = tuple(route for route in ID_ROUTES if route.group == "admin")


@pytest.mark.parametrize("route", ADMIN_ROUTES, ids=str)
async def test_no_token_is_401_with_challenge(
    http: AsyncTestClient,  # type: ignore[type-arg]
    route: Route,
) -> None:
    await matrix.check_unauthenticated(http, route)


@pytest.mark.parametrize("route", ADMIN_ROUTES, ids=str)
async def test_missing_manage_policy_is_403(api: Api, route: Route) -> None:
    await matrix.check_insufficient_scope(api, route)


@pytest.mark.parametrize("route", ADMIN_ID_ROUTES, ids=str)
async def test_other_tenant_id_is_404_like_a_random_id(api: Api, route: Route) -> None:
    await matrix.check_cross_tenant_not_found(api, route)


@pytest.mark.parametrize("route", ADMIN_ROUTES, ids=str)
async def test_manage_policy_alone_is_enough(api: Api, route: Route) -> None:
    await matrix.check_minimal_scope(api, route)


def test_route_table_covers_every_admin_route() -> None:
    from service.app import create_app

    declared = {
        (
            method,
            route.path.replace("{principal_id:str}", "{id}")
            .replace("{client_id:str}", "{id}")
            .rstrip("/"),
        )
        for route in create_app().routes
        if route.path.startswith(("/v1/principals", "/v1/clients"))
        for method in getattr(route, "methods", ())
        if method not in {"HEAD", "OPTIONS"}
    }
    assert declared == {(route.method, route.template) for route in ADMIN_ROUTES}
