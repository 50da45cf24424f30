"""Helpers of the quota tests: limits set through the service function on a real session (the
platform admin's routes are wired elsewhere), audit rows and stored rows read as the owner."""

from __future__ import annotations

import re
import uuid
from typing import Any

import httpx
from sqlalchemy import text

from service.auth.principal import Principal
from service.quotas.schemas import Limits
from service.quotas.service import set_limits
from service.runtime import Runtime
from tests.fixtures.api import Agent, Api
from tests.integration.memory.support import as_owner

POLICY = re.compile(r'^"(?P<name>[a-z-]+)";q=(?P<q>\d+)(;w=(?P<w>\d+))?$')
REMAINING = re.compile(r'^"(?P<name>[a-z-]+)";r=(?P<r>\d+);t=(?P<t>\d+)$')


async def limit(
    runtime: Runtime, tenant_id: str, client_id: str | None = None, **fields: Any
) -> None:
    """Set limits as the platform admin's route will: one transaction, the service function."""
    async with runtime.sessionmaker.begin() as session:
        await set_limits(session, uuid.UUID(tenant_id), Limits(**fields), client_id)
    runtime.quotas.forget(uuid.UUID(tenant_id))


def assert_limited(response: httpx.Response, policy: str, quota: int) -> dict[str, Any]:
    """A 429 with the problem, `Retry-After` and both IETF fields naming `policy`."""
    assert response.status_code == 429, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = response.json()
    assert (body["limit"], body["quota"]) == (policy, quota), body
    retry = int(response.headers["retry-after"])
    assert retry >= 1
    assert body["retry_after"] == retry
    declared = POLICY.match(response.headers["ratelimit-policy"])
    assert declared is not None, response.headers["ratelimit-policy"]
    assert (declared["name"], int(declared["q"])) == (policy, quota)
    current = REMAINING.match(response.headers["ratelimit"])
    assert current is not None, response.headers["ratelimit"]
    assert (current["name"], current["r"], int(current["t"])) == (policy, "0", retry)
    assert policy in body["detail"]
    if body["type"].endswith("/rate-limited"):  # a storage quota says what to delete instead
        assert "retry after" in body["detail"].lower()
    return body


async def audit_of(runtime: Runtime, tenant_id: str, status: int) -> list[dict[str, Any]]:
    async with as_owner(runtime) as conn:
        rows = await conn.execute(
            text(
                "SELECT action, reason, decision, status FROM audit_events"
                " WHERE tenant_id = :t AND status = :s ORDER BY seq"
            ),
            {"t": tenant_id, "s": status},
        )
        return [dict(row) for row in rows.mappings()]


async def stored(runtime: Runtime, tenant_id: str) -> int:
    async with as_owner(runtime) as conn:
        found = await conn.execute(
            text("SELECT count(*) FROM memories WHERE tenant_id = :t"), {"t": tenant_id}
        )
        return int(found.scalar_one())


def principal_of(api: Api, agent: Agent) -> Principal:
    """The agent as an authenticated caller, to hold a call "in flight" with `Quotas.admit`."""
    return Principal(
        tenant_id=uuid.UUID(api.tenant_id),
        principal_id=uuid.UUID(agent.principal_id),
        client_id=agent.client_id,
        scopes=frozenset({"read:memory"}),
        token_id="held",
        issuer="test",
        embedded=True,
    )
