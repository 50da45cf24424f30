"""`audit_append()` writes only to the chain of the tenant the transaction names, and only for a
tenant that exists (review item 6): the app role used to append anything to any chain, even of
tenants that do not exist, and verify still said ok."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from tests.fixtures.api import Api
from tests.integration.audit.support import verify_report

_NAME = "SELECT set_config('memgate.tenant_id', :tenant, true)"
_APPEND = (
    "SELECT appended_seq FROM audit_append(CAST(:tenant AS uuid), 'forged', NULL, NULL, NULL, "
    "'{}', NULL, NULL, '{}', 'GET', '/v1/memories', 'memory.list', '{}', 0, 'allow', 'ok', "
    "200, 1)"
)


async def _heads(api: Api) -> dict[str, int]:
    async with api.runtime.engine.connect() as conn:
        rows = await conn.execute(text("SELECT tenant_id, seq FROM audit_heads"))
        return {str(tenant): int(seq) for tenant, seq in rows}


async def _append_as_app(api: Api, named: str | None, tenant: str) -> Any:
    async with api.runtime.engine.begin() as conn:
        if named is not None:
            await conn.execute(text(_NAME), {"tenant": named})
        return (await conn.execute(text(_APPEND), {"tenant": tenant})).scalar_one()


@pytest.mark.parametrize("named", ["own", "none"])
async def test_no_row_for_another_tenant(api: Api, named: str) -> None:
    other = await api.other_tenant()
    before = await _heads(api)
    with pytest.raises(DBAPIError) as refused:
        await _append_as_app(api, api.tenant_id if named == "own" else None, other.tenant_id)
    assert getattr(refused.value.orig, "sqlstate", None) == "42501"
    assert await _heads(api) == before
    assert (await verify_report(other))["ok"] is True


async def test_no_row_for_a_tenant_that_does_not_exist(api: Api) -> None:
    ghost = str(uuid.uuid4())
    with pytest.raises(DBAPIError) as refused:
        await _append_as_app(api, ghost, ghost)
    assert getattr(refused.value.orig, "sqlstate", None) == "23503"  # foreign_key_violation
    assert ghost not in await _heads(api)


async def test_the_own_chain_and_the_platform_chain_still_append(api: Api) -> None:
    before = await _heads(api)
    seq = await _append_as_app(api, api.tenant_id, api.tenant_id)
    assert seq == before[api.tenant_id] + 1
    # An unauthenticated call lands on the platform chain, named by the recorder.
    platform = str(uuid.UUID(int=0))
    assert (await api.http.get("/v1/memories")).status_code == 401
    assert (await _heads(api))[platform] == before.get(platform, 0) + 1
    assert (await verify_report(api))["ok"] is True
