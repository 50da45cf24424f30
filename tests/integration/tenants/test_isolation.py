"""Platform administration is not data access, and a tenant cannot administer tenants: the
platform admin's token reads no other tenant's memories, principals, clients, policy or audit;
a tenant's own transactions see only its own `tenants` row and cannot change its lifecycle
(row-level security and the lifecycle trigger, below the API)."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from tests.fixtures.api import Api
from tests.integration.memory.support import assert_problem
from tests.integration.tenants.support import platform


async def test_the_platform_admin_reads_no_tenants_data(api: Api) -> None:
    admin = await platform(api)
    alice = await api.new_agent("alice")
    memory = await api.remember(alice, key="secret.plan", value="the acme launch plan")
    headers = admin.admin.headers
    # By id: the same 404 as a random id.
    for path, slug in (
        (f"/v1/memories/{memory['id']}", "memory-not-found"),
        (f"/v1/principals/{alice.principal_id}", "principal-not-found"),
        (f"/v1/clients/{alice.client_id}", "client-not-found"),
    ):
        response = await admin.http.get(path, headers=headers)
        assert_problem(response, 404, slug)
    # Search, list and counts see only the platform tenant's own (empty) data.
    found = await admin.search(admin.admin, "launch plan", k=10)
    assert found.status_code == 200, found.text
    assert found.json()["hits"] == []
    listed = (await admin.http.get("/v1/memories", headers=headers)).json()
    assert listed["items"] == []
    assert (await admin.http.get("/v1/memories/counts", headers=headers)).json()["total"] == 0
    principals = (await admin.http.get("/v1/principals", headers=headers)).json()["items"]
    assert alice.principal_id not in {p["id"] for p in principals}
    clients = (await admin.http.get("/v1/clients", headers=headers)).json()["items"]
    assert alice.client_id not in {c["client_id"] for c in clients}
    permissions = await admin.http.get(
        f"/v1/principals/{alice.principal_id}/permissions", headers=headers
    )
    assert permissions.status_code == 404, permissions.text
    # The audit log it reads is the platform chain's: none of alice's calls, nor the memory.
    events = await admin.http.get("/v1/audit/events", headers=headers)
    assert events.status_code == 200, events.text
    items = events.json()["items"]
    assert items
    assert {e["tenant_id"] for e in items} == {admin.tenant_id}
    assert alice.client_id not in {e["client_id"] for e in items}
    assert not [
        e
        for e in items
        if e["action"].startswith("memory.")
        and e["status"] < 400
        and e["client_id"] != admin.admin.client_id
    ]
    # The memory is still there for its owner.
    assert (
        await api.http.get(f"/v1/memories/{memory['id']}", headers=alice.headers)
    ).status_code == 200


async def _as_tenant(api: Api, tenant_id: str, sql: str) -> object:
    async with api.runtime.sessionmaker.begin() as session:
        await session.execute(
            text("SELECT set_config('memgate.tenant_id', :t, true)"), {"t": tenant_id}
        )
        return (await session.execute(text(sql))).all()


async def test_a_tenant_sees_its_own_row_and_cannot_change_its_lifecycle(api: Api) -> None:
    admin = await platform(api)
    other = await api.other_tenant()
    rows = await _as_tenant(api, api.tenant_id, "SELECT tenant_id FROM tenants")
    assert [str(r[0]) for r in rows] == [api.tenant_id]  # type: ignore[attr-defined]
    assert await _as_tenant(api, str(uuid.uuid4()), "SELECT tenant_id FROM tenants") == []
    everything = await _as_tenant(api, admin.tenant_id, "SELECT count(*) FROM tenants")
    assert everything[0][0] == 3  # type: ignore[index]
    # Its own policy version may move (policy changes); its lifecycle may not.
    await _as_tenant(
        api, api.tenant_id, "UPDATE tenants SET policy_version = policy_version + 1 RETURNING 1"
    )
    for change in (
        "is_platform = true",
        "disabled_at = now()",
        "settings = '{\"max_k\": 100}'",
        "name = 'mine now'",
    ):
        with pytest.raises(DBAPIError, match="only the platform tenant"):
            await _as_tenant(api, api.tenant_id, f"UPDATE tenants SET {change} RETURNING 1")
    # Another tenant's row is not even there to update; no tenant can make or delete one.
    assert (
        await _as_tenant(
            api,
            api.tenant_id,
            f"UPDATE tenants SET name = 'x' WHERE tenant_id = '{other.tenant_id}' RETURNING 1",
        )
        == []
    )
    with pytest.raises(DBAPIError, match="row-level security"):
        await _as_tenant(
            api,
            api.tenant_id,
            f"INSERT INTO tenants (tenant_id, name) VALUES ('{uuid.uuid4()}', 'x') RETURNING 1",
        )
    with pytest.raises(DBAPIError, match="permission denied"):
        await _as_tenant(api, admin.tenant_id, "DELETE FROM tenants RETURNING 1")
