"""Row-level security on every tenant table, not only memories (review item 15): a statement
with no tenant predicate at all, run as the app role, sees and writes only the tenant the
transaction names, and nothing when none is named."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.fixtures.api import Api

TENANT_TABLES = (
    "principals",
    "clients",
    "spaces",
    "teams",
    "casbin_rule",
    "principal_roles",
    "role_grants",
    "space_grants",
    "delegations",
    "audit_actors",
    "audit_pseudonym_keys",
)
_NAME = "SELECT set_config('memgate.tenant_id', :tenant, true)"


async def _tenants_seen(engine: AsyncEngine, table: str, named: str | None) -> dict[str, int]:
    async with engine.begin() as conn:
        if named is not None:
            await conn.execute(text(_NAME), {"tenant": named})
        rows = await conn.execute(text(f"SELECT tenant_id::text, count(*) FROM {table} GROUP BY 1"))
        return {tenant: int(n) for tenant, n in rows}


async def _two_tenants(api: Api) -> Api:
    alice = await api.new_agent("alice")
    team = (await api.http.post("/v1/teams", json={"name": "t"}, headers=api.admin.headers)).json()
    await api.http.put(
        f"/v1/teams/{team['id']}/members/{alice.principal_id}", headers=api.admin.headers
    )
    other = await api.other_tenant()
    await other.new_agent("carol")
    await other.http.post("/v1/teams", json={"name": "u"}, headers=other.admin.headers)
    return other


@pytest.mark.parametrize("table", TENANT_TABLES)
async def test_each_table_shows_only_the_named_tenant(
    api: Api, owner_engine: AsyncEngine, table: str
) -> None:
    other = await _two_tenants(api)
    everything = await _tenants_seen(owner_engine, table, None)
    app = api.runtime.engine
    if table != "delegations":  # no delegation was made; the table must still be covered
        assert {api.tenant_id, other.tenant_id} <= set(everything), table
    for tenant in (api.tenant_id, other.tenant_id):
        seen = await _tenants_seen(app, table, tenant)
        assert set(seen) <= {tenant}, table
        assert seen.get(tenant, 0) == everything.get(tenant, 0), table
    assert await _tenants_seen(app, table, None) == {}
    assert await _tenants_seen(app, table, str(uuid.uuid4())) == {}


async def _plant_team(engine: AsyncEngine, named: str, tenant: str) -> None:
    async with engine.begin() as conn:
        await conn.execute(text(_NAME), {"tenant": named})
        await conn.execute(
            text("INSERT INTO teams (tenant_id, id, name) VALUES (:t, :id, 'planted')"),
            {"t": tenant, "id": uuid.uuid4()},
        )


async def test_writes_into_another_tenant_are_refused_and_change_nothing(
    api: Api, owner_engine: AsyncEngine
) -> None:
    other = await _two_tenants(api)
    before = await _tenants_seen(owner_engine, "teams", None)
    with pytest.raises(DBAPIError) as refused:
        await _plant_team(api.runtime.engine, api.tenant_id, other.tenant_id)
    assert getattr(refused.value.orig, "sqlstate", None) == "42501"
    assert await _tenants_seen(owner_engine, "teams", None) == before
    async with api.runtime.engine.connect() as conn:
        await conn.begin()
        await conn.execute(text(_NAME), {"tenant": api.tenant_id})
        renamed = await conn.execute(text("UPDATE principals SET display_name = 'x'"))
        deleted = await conn.execute(text("DELETE FROM casbin_rule"))
        await conn.rollback()
    # Only the named tenant's rows were reachable (and that work was rolled back).
    assert (
        renamed.rowcount == (await _tenants_seen(owner_engine, "principals", None))[api.tenant_id]
    )
    assert (
        deleted.rowcount == (await _tenants_seen(owner_engine, "casbin_rule", None))[api.tenant_id]
    )


async def test_the_token_endpoint_finds_clients_before_it_knows_the_tenant(api: Api) -> None:
    other = await _two_tenants(api)
    carol = await other.new_agent("carol2")
    token = await other.access_token(carol.client_id, carol.secret)
    listed = await api.http.get("/v1/memories", headers={"Authorization": f"Bearer {token}"})
    assert listed.status_code == 200, listed.text
    # The narrow entrance answers one enabled client by id, and nothing to the app role else.
    async with api.runtime.engine.begin() as conn:
        found = (
            await conn.execute(
                text("SELECT tenant_id::text FROM memgate_token_client(:id)"),
                {"id": carol.client_id},
            )
        ).all()
        unnamed = (await conn.execute(text("SELECT count(*) FROM clients"))).scalar_one()
    assert [row[0] for row in found] == [other.tenant_id]
    assert unnamed == 0
