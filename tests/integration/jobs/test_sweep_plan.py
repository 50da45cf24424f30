"""The sweep reads the rows past their time from `ix_memories_expiry`, never the tenant: its
statement, as the job principal runs it, on a tenant of 20 001 rows of which 200 are past
retention (docs/jobs.md shows this plan)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import text

from service.db.models import JobRun
from service.db.tenancy import name_tenant
from service.jobs.principals import job_principal, snapshot_of, tenant_settings
from service.memory.sweep import expired_rows
from service.policy.visible import Action, visible
from tests.fixtures.api import Api
from tests.integration.jobs.support import queue, setup
from tests.integration.memory.support import as_owner

ROWS = 20_000
NAME_PRINCIPAL = "SELECT set_config('memgate.principal_id', :principal, true)"


async def _fill(api: Api, seed: str) -> None:
    """ROWS copies of one memory: every 100th past retention, every 10th expiring tomorrow."""
    async with as_owner(api.runtime) as conn:
        await conn.execute(text("ALTER TABLE memories NO FORCE ROW LEVEL SECURITY"))
        await conn.execute(
            text(
                "INSERT INTO memories (tenant_id, id, space_id, owner_id, writer_id, client_id, "
                "subject, kind, key, value, content_hash, embedding, embedding_model, expires_at) "
                "SELECT tenant_id, gen_random_uuid(), space_id, owner_id, writer_id, client_id, "
                "subject, kind, 'k' || g, value, content_hash, embedding, embedding_model, "
                "CASE WHEN g % 100 = 0 THEN now() - interval '40 days' "
                "WHEN g % 10 = 0 THEN now() + interval '1 day' END "
                "FROM memories, generate_series(1, :rows) g WHERE id = :id"
            ),
            {"rows": ROWS, "id": seed},
        )
        await conn.execute(text("ALTER TABLE memories FORCE ROW LEVEL SECURITY"))
        await conn.commit()
        await conn.execute(text("ANALYZE memories"))
        await conn.commit()


async def test_the_sweep_reads_the_expiry_index_not_the_tenant(api: Api) -> None:
    s = await setup(api)
    seed = await api.remember(s.writer, key="seed", space_id=s.space_id)
    await _fill(api, seed["id"])
    run_id = await queue(api, "memory.sweep_expired")
    async with api.runtime.sessionmaker() as session:
        await name_tenant(session, s.tenant)
        run = await session.get(JobRun, (s.tenant, run_id))
        assert run is not None
        settings = await tenant_settings(session, s.tenant)
        assert settings is not None
        principal = job_principal(s.tenant, run_id, snapshot_of(run.granted), settings)
        await session.execute(text(NAME_PRINCIPAL), {"principal": str(principal.principal_id)})
        cutoff = datetime.now(UTC) - timedelta(days=30)
        statement = expired_rows(visible(principal, Action.DELETE), cutoff, None, None, 100)
        conn = await session.connection()
        compiled = statement.compile(dialect=conn.dialect)
        explain = "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) " + str(compiled)
        plan = "\n".join(row[0] for row in await conn.exec_driver_sql(explain, compiled.params))
    print(plan)  # the plan docs/jobs.md shows (`pytest -s` prints it)
    assert "Index Scan using ix_memories_expiry on memories" in plan
    assert "Seq Scan on memories" not in plan
    scanned = [line for line in plan.splitlines() if "ix_memories_expiry" in line]
    assert scanned == [scanned[0]]
    assert "actual rows=200.00" in scanned[0]  # the expired rows only, of 20 001
