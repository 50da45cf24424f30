"""Helpers of the tenant API tests: the platform admin, the routes, and owner reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from tests.fixtures.api import Api


@dataclass(frozen=True)
class TenantRoute:
    method: str
    template: str
    body: dict[str, Any] | None = None

    @property
    def takes_id(self) -> bool:
        return "{id}" in self.template

    def path(self, tenant_id: str) -> str:
        return self.template.replace("{id}", tenant_id)

    def __str__(self) -> str:
        return f"{self.method} {self.template}"


TENANT_ROUTES: tuple[TenantRoute, ...] = (
    TenantRoute("POST", "/v1/tenants", {"name": "initech"}),
    TenantRoute("GET", "/v1/tenants"),
    TenantRoute("GET", "/v1/tenants/{id}"),
    TenantRoute("PATCH", "/v1/tenants/{id}", {"name": "renamed"}),
    TenantRoute("POST", "/v1/tenants/{id}/disable"),
    TenantRoute("POST", "/v1/tenants/{id}/enable"),
    TenantRoute("DELETE", "/v1/tenants/{id}"),
    TenantRoute("GET", "/v1/tenants/{id}/proof"),
    TenantRoute("GET", "/v1/tenants/{id}/limits"),
    TenantRoute("PUT", "/v1/tenants/{id}/limits", {"requests_per_second": 5}),
    # The client id is the tenant's id again: a client that exists nowhere.
    TenantRoute("PUT", "/v1/tenants/{id}/clients/{id}/limits", {"requests_per_second": 5}),
)
"""Every /v1/tenants route (tests/integration/test_route_access.py lists them)."""


async def platform(api: Api) -> Api:
    """The platform tenant of `api`'s database (its admin is the platform admin)."""
    return await Api.platform(api.http, api.runtime)


async def send(
    api: Api, route: TenantRoute, tenant_id: str, token: str | None, **extra: Any
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    kwargs: dict[str, Any] = {"headers": headers, **extra}
    if route.body is not None and "json" not in kwargs:
        kwargs["json"] = route.body
    response: httpx.Response = await api.http.request(route.method, route.path(tenant_id), **kwargs)
    return response
