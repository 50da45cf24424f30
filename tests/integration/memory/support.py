"""Shared helpers of the memory and identity API tests: problem assertions, raw row counts and
the route table the access matrix is parametrized over."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from service.db.session import create_engine
from service.problems import PROBLEM_BASE_URI, PROBLEM_TYPES
from service.runtime import Runtime
from tests.fixtures.entrance import bypasses_visible

PROBLEM_JSON = "application/problem+json"


def problem_uri(slug: str) -> str:
    return PROBLEM_BASE_URI + slug


def assert_problem(response: httpx.Response, status: int, slug: str) -> dict[str, Any]:
    """The response is an RFC 9457 problem of this type with a non-empty detail."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].split(";")[0].strip() == PROBLEM_JSON, response.headers
    body: dict[str, Any] = response.json()
    assert body["type"] == problem_uri(slug), body
    assert body["status"] == status, body
    assert body["title"] == PROBLEM_TYPES[slug].title, body
    assert isinstance(body["detail"], str), body
    assert body["detail"].strip(), body
    return body


@asynccontextmanager
async def as_owner(runtime: Runtime) -> AsyncIterator[AsyncConnection]:
    """The database as its owner, past row-level security and Visible: what is really stored
    (the tests' oracle, so it may read the memory table directly)."""
    engine = create_engine(runtime.settings.database.url, pool_size=1)
    try:
        with bypasses_visible("test oracle: what is really stored"):
            async with engine.connect() as conn:
                yield conn
    finally:
        await engine.dispose()


async def scalar(runtime: Runtime, sql: str, **params: Any) -> Any:
    async with as_owner(runtime) as conn:
        return (await conn.execute(text(sql), params)).scalar()


async def count_memories(runtime: Runtime) -> int:
    count: int = await scalar(runtime, "SELECT count(*) FROM memories")
    return count


async def memory_rows(runtime: Runtime, where: str = "TRUE", **params: Any) -> list[dict[str, Any]]:
    """Raw rows of `memories` (bypassing every API filter), oldest version first."""
    async with as_owner(runtime) as conn:
        result = await conn.execute(
            text(
                "SELECT id, tenant_id, space_id, owner_id, subject, kind, key, value, version, "
                "supersedes, superseded_by, superseded_at, valid_from, valid_until, recorded_at, "
                "expires_at, retracted_at, content_hash, source, metadata, "
                "embedding::text AS embedding "
                f"FROM memories WHERE {where} ORDER BY version, recorded_at, id"
            ),
            params,
        )
        return [dict(row) for row in result.mappings().all()]


@dataclass(frozen=True)
class Targets:
    """Ids a route template can be filled with (`{id}`) plus valid bodies for its happy path."""

    memory_id: str
    principal_id: str
    client_id: str
    issuer_id: str = ""
    space_id: str = ""


@dataclass(frozen=True)
class Route:
    method: str
    template: str
    scope: str
    group: str  # "memory", "admin" or "audit"
    resource: str | None = None  # what `{id}` names: "memory", "principal", "client", "issuer"
    body: Callable[[Targets], dict[str, Any]] | None = None
    ok_status: int = 200

    def path(self, resource_id: str) -> str:
        return self.template.replace("{id}", resource_id)

    @property
    def not_found_slug(self) -> str:
        assert self.resource is not None
        return f"{self.resource}-not-found"

    def __str__(self) -> str:
        return f"{self.method} {self.template}"


def _memory_body(_: Targets) -> dict[str, Any]:
    # A distinct fact beside the caller's own memory of the subject: past the write gate.
    return {
        "subject": "service:billing",
        "kind": "fact",
        "key": "matrix",
        "value": "matrix row",
        "new_key": True,
    }


def _batch_body(targets: Targets) -> dict[str, Any]:
    return {"items": [_memory_body(targets) | {"key": "matrix.batch"}]}


def _search_body(_: Targets) -> dict[str, Any]:
    return {"query": "the caller's own memory", "k": 5}  # its words: clears the floor


def _reason_body(_: Targets) -> dict[str, Any]:
    return {"reason": "withdrawn"}


def _principal_body(_: Targets) -> dict[str, Any]:
    return {"display_name": "matrix-bot", "kind": "agent"}


def _client_body(targets: Targets) -> dict[str, Any]:
    return {"principal_id": targets.principal_id, "name": "matrix", "scopes": ["read:memory"]}


def issuer_body(_: Targets) -> dict[str, Any]:
    """A registration no other test holds (the pair is unique across the platform)."""
    return {
        "issuer": "https://login.matrix.test",
        "audience": f"matrix-{uuid.uuid4()}",
        "jwks_url": "https://login.matrix.test/jwks",
    }


ROUTES: tuple[Route, ...] = (
    Route("POST", "/v1/memories", "write:memory", "memory", body=_memory_body, ok_status=201),
    Route("POST", "/v1/memories:batch", "write:memory", "memory", body=_batch_body, ok_status=201),
    Route("GET", "/v1/memories", "read:memory", "memory"),
    Route("GET", "/v1/memories/counts", "read:memory", "memory"),
    Route("POST", "/v1/memories/search", "read:memory", "memory", body=_search_body),
    Route("GET", "/v1/memories/{id}", "read:memory", "memory", resource="memory"),
    Route("GET", "/v1/memories/{id}/history", "read:memory", "memory", resource="memory"),
    Route("POST", "/v1/memories/{id}/revert", "write:memory", "memory", "memory", ok_status=201),
    Route(
        "DELETE", "/v1/memories/{id}", "delete:memory", "memory", resource="memory", ok_status=204
    ),
    # Review (issue 15): the scope lets the call in; alice reviews no space (403 by policy).
    Route("POST", "/v1/memories/{id}/approve", "review:memory", "memory", "memory", ok_status=403),
    Route(
        "POST",
        "/v1/memories/{id}/reject",
        "review:memory",
        "memory",
        "memory",
        body=lambda _: {"reason": "matrix"},
        ok_status=403,
    ),
    Route("GET", "/v1/spaces/{id}/proposals", "review:memory", "memory", "space", ok_status=403),
    Route("POST", "/v1/memories/{id}/revoke", "delete:memory", "memory", "memory", _reason_body),
    Route("POST", "/v1/memories/{id}/reinstate", "delete:memory", "memory", "memory", _reason_body),
    Route("POST", "/v1/principals", "manage:policy", "admin", body=_principal_body, ok_status=201),
    Route("GET", "/v1/principals", "manage:policy", "admin"),
    Route("GET", "/v1/principals/{id}", "manage:policy", "admin", resource="principal"),
    Route("POST", "/v1/clients", "manage:policy", "admin", body=_client_body, ok_status=201),
    Route("GET", "/v1/clients", "manage:policy", "admin"),
    Route("GET", "/v1/clients/{id}", "manage:policy", "admin", resource="client"),
    Route("POST", "/v1/clients/{id}/disable", "manage:policy", "admin", resource="client"),
    Route("POST", "/v1/clients/{id}/enable", "manage:policy", "admin", resource="client"),
    Route("PUT", "/v1/principals/{id}/roles/auditor", "manage:policy", "admin", "principal"),
    Route(
        "DELETE",
        "/v1/principals/{id}/roles/auditor",
        "manage:policy",
        "admin",
        resource="principal",
        ok_status=204,
    ),
    Route("POST", "/v1/issuers", "manage:policy", "admin", body=issuer_body, ok_status=201),
    Route("GET", "/v1/issuers", "manage:policy", "admin"),
    Route("GET", "/v1/issuers/{id}", "manage:policy", "admin", resource="issuer"),
    Route("DELETE", "/v1/issuers/{id}", "manage:policy", "admin", resource="issuer", ok_status=204),
    Route("GET", "/v1/audit/events", "read:audit", "audit"),
    Route("GET", "/v1/audit/export", "read:audit", "audit"),
    Route("GET", "/v1/audit/verify", "read:audit", "audit"),
    Route("GET", "/v1/audit/checkpoints/latest", "read:audit", "audit"),
    Route("GET", "/v1/audit/keys", "read:audit", "audit"),
)
ID_ROUTES = tuple(route for route in ROUTES if route.resource is not None)


def random_id() -> str:
    return str(uuid.uuid4())


def target_id(route: Route, targets: Targets) -> str:
    if route.resource == "memory":
        return targets.memory_id
    if route.resource == "principal":
        return targets.principal_id
    if route.resource == "client":
        return targets.client_id
    if route.resource == "issuer":
        return targets.issuer_id
    if route.resource == "space":
        return targets.space_id
    return random_id()


async def call(
    http: Any,
    route: Route,
    resource_id: str,
    headers: dict[str, str] | None = None,
    body: dict[str, Any] | None = None,
) -> httpx.Response:
    if body is None and route.resource is not None and route.body is not None:
        body = route.body(Targets("", "", ""))  # a route on an id whose body names none
    response: httpx.Response = await http.request(
        route.method, route.path(resource_id), json=body, headers=headers or {}
    )
    return response
