"""What the app role may do with job runs: read, queue and update its named tenant's runs only,
never delete one; across tenants it sees due run ids through one narrow function."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.fixtures.api import Api
from tests.integration.jobs.support import queue
from tests.integration.memory.support import scalar
from tests.integration.tenants.support import platform

NAME = "SELECT set_config('memgate.tenant_id', :tenant, true)"


async def _seen(engine: AsyncEngine, named: str | None) -> dict[str, int]:
    async with engine.begin() as conn:
        if named is not None:
            await conn.execute(text(NAME), {"tenant": named})
        rows = await conn.execute(text("SELECT tenant_id::text, count(*) FROM job_runs GROUP BY 1"))
        return {tenant: int(n) for tenant, n in rows}


async def test_runs_are_seen_only_in_the_named_tenant_and_never_deleted(
    api: Api, owner_engine: AsyncEngine
) -> None:
    other = await api.other_tenant()
    await queue(api, "memory.sweep_expired", dry_run=True)
    await queue(other, "memory.sweep_expired", dry_run=True)
    app = api.runtime.engine
    assert await _seen(owner_engine, None) == {api.tenant_id: 1, other.tenant_id: 1}
    assert await _seen(app, api.tenant_id) == {api.tenant_id: 1}
    assert await _seen(app, None) == {}
    assert await _seen(app, str(uuid.uuid4())) == {}
    async with app.connect() as conn:
        await conn.begin()
        await conn.execute(text(NAME), {"tenant": api.tenant_id})
        with pytest.raises(DBAPIError) as refused:
            await conn.execute(text("DELETE FROM job_runs"))
        await conn.rollback()
    assert getattr(refused.value.orig, "sqlstate", None) == "42501"
    async with app.connect() as conn:
        granted = {
            privilege: bool(
                await conn.scalar(
                    text("SELECT has_table_privilege(current_user, 'job_runs', :p)"),
                    {"p": privilege},
                )
            )
            for privilege in ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE")
        }
        due = (await conn.execute(text("SELECT * FROM memgate_job_runs_due(300)"))).all()
        deletes_memories = await conn.scalar(
            text("SELECT has_table_privilege(current_user, 'memories', 'DELETE')")
        )
    assert granted == {
        "SELECT": True,
        "INSERT": True,
        "UPDATE": True,
        "DELETE": False,
        "TRUNCATE": False,
    }
    # The sweep's hard delete goes through the memories_delete policy (delete and read on the
    # row's space, its audience readable), which the job principal's grants open.
    assert deletes_memories is True
    assert {str(row.tenant_id) for row in due} == {api.tenant_id, other.tenant_id}
    assert all(len(row) == 2 for row in due)  # ids only


async def test_a_deleted_tenants_runs_go_with_its_data(api: Api) -> None:
    other = await api.other_tenant()
    await queue(api, "memory.sweep_expired", dry_run=True)
    await queue(other, "memory.sweep_expired", dry_run=True)
    admin = await platform(api)
    path = f"/v1/tenants/{api.tenant_id}"
    assert (await admin.http.post(f"{path}/disable", headers=admin.admin.headers)).is_success
    plan = (await admin.http.delete(path, headers=admin.admin.headers)).json()
    done = await admin.http.delete(
        path, params={"confirm": plan["confirm"]}, headers=admin.admin.headers
    )
    assert done.status_code == 200, done.text
    left = await scalar(
        api.runtime, "SELECT count(*) FROM job_runs WHERE tenant_id = :t", t=api.tenant_id
    )
    kept = await scalar(
        api.runtime, "SELECT count(*) FROM job_runs WHERE tenant_id = :t", t=other.tenant_id
    )
    assert (left, kept) == (0, 1)
