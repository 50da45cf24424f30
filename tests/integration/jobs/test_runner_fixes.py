"""What a red-team reproduced in the job runner, fixed: a flood of runs is joined and capped,
due runs are fair across tenants and run batch by batch in turns, a run's counts and writes
stay inside what its starter may read, operator joins compare options, the job principal gets
no credentials, and one failing run stops neither the worker nor the CLI for anyone else."""

from __future__ import annotations

import io
import uuid

import pytest
from sqlalchemy import text

from service.consolidation.jobs import CONSOLIDATION
from service.jobs import cli
from service.jobs.declare import Batch, BatchDone, Job
from service.jobs.registry import JOBS
from service.jobs.runner import Progress, Runner
from service.jobs.scheduler import queue_as_operator
from service.jobs.schemas import RunCreate
from tests.fixtures.api import Api
from tests.integration.jobs.support import (
    audit_rows,
    queue,
    run_of,
    runner,
    setup,
    start,
)
from tests.integration.memory.support import as_owner, count_memories, scalar

SWEEP = "memory.sweep_expired"
CONSOLIDATE = "memory.consolidate"


def _counting(batches: int) -> Job:
    """A job of `batches` batches that touches nothing (its cursor counts them)."""

    async def step(batch: Batch) -> BatchDone:
        done = int(batch.cursor or 0) + 1
        return BatchDone({"steps": 1}, None if done >= batches else str(done))

    return Job(JOBS[SWEEP].operation, step, needs=frozenset())


def _failing_in(api: Api) -> Job:
    """A job whose batches raise in `api`'s tenant (a summarizer or embedder that is down
    there) and finish at once elsewhere."""

    async def step(batch: Batch) -> BatchDone:
        if batch.scope.tenant_id == uuid.UUID(api.tenant_id):
            raise RuntimeError("down")
        return BatchDone({"steps": 1}, None)

    return Job(JOBS[SWEEP].operation, step, needs=frozenset())


# 1. the queue ---------------------------------------------------------------------------


async def test_identical_requests_join_one_pending_run(api: Api) -> None:
    first = await start(api, SWEEP, dry_run=True)
    again = await start(api, SWEEP, dry_run=True)
    assert first.status_code == again.status_code == 202, again.text
    assert again.json()["id"] == first.json()["id"]
    # Any difference (dry run, options) is another run.
    wet = await queue(api, SWEEP)
    one = await queue(api, CONSOLIDATE, options={"subject": "service:a"})
    other = await queue(api, CONSOLIDATE, options={"subject": "service:b"})
    assert len({first.json()["id"], str(wet), str(one), str(other)}) == 4
    assert await scalar(api.runtime, "SELECT count(*) FROM job_runs") == 4
    # A run that has ended is not joined: the same request queues a new one.
    await runner(api).run(uuid.UUID(api.tenant_id), uuid.UUID(first.json()["id"]))
    later = await queue(api, SWEEP, dry_run=True)
    assert str(later) != first.json()["id"]


async def test_the_tenants_pending_runs_are_capped(api: Api) -> None:
    cap = api.runtime.settings.jobs.max_pending
    for i in range(cap):
        await queue(api, CONSOLIDATE, options={"subject": f"service:s{i}"}, dry_run=True)
    refused = await start(api, CONSOLIDATE, options={"subject": "service:one-more"}, dry_run=True)
    assert refused.status_code == 429, refused.text
    assert refused.headers["content-type"].startswith("application/problem+json")
    assert refused.json()["type"].endswith("/job-queue-full")
    assert int(refused.headers["retry-after"]) > 0
    assert str(cap) in refused.json()["detail"]
    assert await scalar(api.runtime, "SELECT count(*) FROM job_runs") == cap
    # Joining an identical pending run is still answered: it adds nothing.
    joined = await start(api, CONSOLIDATE, options={"subject": "service:s0"}, dry_run=True)
    assert joined.status_code == 202, joined.text
    # Another tenant has its own cap.
    other = await api.other_tenant()
    await queue(other, SWEEP, dry_run=True)
    # Once runs end, the tenant may queue again.
    await runner(api).pick_up()
    assert (await start(api, CONSOLIDATE, options={"subject": "service:x"})).status_code == 202


async def test_due_runs_put_every_tenants_oldest_first(api: Api) -> None:
    other = await api.other_tenant()
    flood = await queue(api, SWEEP, dry_run=True)
    async with as_owner(api.runtime) as conn:  # 150 runs of one tenant (no API queues them)
        await conn.execute(
            text(
                "INSERT INTO job_runs (tenant_id, id, job, dry_run, options, status, "
                "principal_id, granted) SELECT tenant_id, gen_random_uuid(), job, dry_run, "
                "jsonb_build_object('n', g::text), status, principal_id, granted "
                "FROM job_runs, generate_series(1, 150) g WHERE id = :id"
            ),
            {"id": str(flood)},
        )
        await conn.commit()
    victim = await queue(other, SWEEP, dry_run=True)
    async with api.runtime.sessionmaker() as session:
        due = (
            await session.execute(text("SELECT tenant_id, id FROM memgate_job_runs_due(300)"))
        ).all()
    assert len(due) == 100
    assert {str(due[0][0]), str(due[1][0])} == {api.tenant_id, other.tenant_id}
    assert (uuid.UUID(other.tenant_id), victim) in [(row[0], row[1]) for row in due[:2]]
    assert (uuid.UUID(api.tenant_id), flood) in [(row[0], row[1]) for row in due[:2]]


async def test_the_worker_takes_one_batch_of_each_run_in_turn(api: Api) -> None:
    other = await api.other_tenant()
    long = await queue(api, SWEEP, dry_run=True)
    short = await queue(other, SWEEP, dry_run=True)
    seen: list[tuple[uuid.UUID, int, str]] = []

    def note(progress: Progress) -> None:
        seen.append((progress.run_id, progress.batches, progress.status))

    worker = Runner(api.runtime, {SWEEP: _counting(5)}, batch_size=3, on_progress=note)
    assert await worker.pick_up() == 2
    # The other tenant's run does not wait for the long one's five batches: they alternate.
    assert seen[:4] == [
        (long, 1, "running"),
        (short, 1, "running"),
        (long, 2, "running"),
        (short, 2, "running"),
    ]
    assert (
        (await run_of(api, long))["status"] == (await run_of(other, short))["status"] == "finished"
    )
    assert (await run_of(api, long))["counts"] == {"steps": 5}


# 2. who a run acts as -------------------------------------------------------------------


async def test_a_run_counts_and_writes_only_what_its_starter_may_read(api: Api) -> None:
    s = await setup(api, job_actions=("read", "write", "delete"), starter_reads=False)
    await api.remember(
        s.writer,
        space_id=s.space_id,
        subject="user:42",
        key="hr.note",
        value="on a performance plan",
    )
    before = await count_memories(api.runtime)
    # The caller: an admin token narrowed to run:jobs, whose principal reads no team space.
    token = await api.access_token(api.admin.client_id, api.admin.secret, "run:jobs read:memory")
    headers = {"Authorization": f"Bearer {token}"}
    seen = {}
    for subject, dry_run in (("user:42", True), ("user:43", True), ("user:42", False)):
        body = {"dry_run": dry_run, "options": {"subject": subject}}
        r = await api.http.post(f"/v1/jobs/{CONSOLIDATE}/runs", json=body, headers=headers)
        assert r.status_code == 202, r.text
        run_id = uuid.UUID(r.json()["id"])
        await runner(api).run(uuid.UUID(api.tenant_id), run_id)
        got = (await api.http.get(f"/v1/jobs/runs/{run_id}", headers=headers)).json()
        seen[(subject, dry_run)] = (got["status"], got["counts"], got["error"]["slug"])
    # Every run answers the same: nothing the caller cannot read exists for it.
    assert list(seen.values()) == [("refused", {}, "job-grants-missing")] * 3, seen
    assert await count_memories(api.runtime) == before


async def test_a_starter_who_reads_the_space_gets_the_run_it_asked_for(api: Api) -> None:
    s = await setup(api, job_actions=("read", "write", "delete"))
    await api.remember(
        s.writer,
        space_id=s.space_id,
        subject="user:42",
        key="hr.note",
        value="on a performance plan",
    )
    run_id = await queue(api, CONSOLIDATE, dry_run=True, options={"subject": "user:42"})
    stored = await scalar(
        api.runtime,
        "SELECT granted::text FROM job_runs WHERE id = CAST(:id AS uuid)",
        id=str(run_id),
    )
    assert s.space_id in stored  # the admin reads the team space (setup grants it)
    await runner(api).run(uuid.UUID(api.tenant_id), run_id)
    body = await run_of(api, run_id)
    assert body["status"] == "finished", body
    assert sum(body["counts"].values()) > 0, body["counts"]


async def test_operator_runs_keep_the_job_principals_grants(api: Api) -> None:
    s = await setup(api, job_actions=("read", "write", "delete"))
    run_id = await queue_as_operator(
        api.runtime, uuid.UUID(api.tenant_id), CONSOLIDATION, RunCreate(dry_run=True), "CLI"
    )
    assert run_id is not None
    stored = await scalar(
        api.runtime,
        "SELECT granted::text FROM job_runs WHERE id = CAST(:id AS uuid)",
        id=str(run_id),
    )
    assert s.space_id in stored


# 3. the operator's join -----------------------------------------------------------------


async def test_a_whole_tenant_operator_run_never_joins_a_one_subject_run(api: Api) -> None:
    tenant = uuid.UUID(api.tenant_id)
    limited = await queue(api, CONSOLIDATE, options={"subject": "service:billing"})
    whole = await queue_as_operator(api.runtime, tenant, CONSOLIDATION, RunCreate(), "CLI")
    assert whole is not None
    assert whole != limited
    assert (await run_of(api, whole))["options"] == {}
    again = await queue_as_operator(api.runtime, tenant, CONSOLIDATION, RunCreate(), "CLI")
    assert again == whole
    scheduled = await queue_as_operator(api.runtime, tenant, CONSOLIDATION, RunCreate(), "SCHEDULE")
    assert scheduled is None


# 4. the job principal gets no credentials -----------------------------------------------


async def test_no_client_and_no_delegation_for_the_job_principal(api: Api) -> None:
    s = await setup(api, job_actions=("read",))
    clients = await scalar(api.runtime, "SELECT count(*) FROM clients")
    response = await api.http.post(
        "/v1/clients",
        json={"principal_id": s.job_principal, "name": "as-jobs", "scopes": ["read:memory"]},
        headers=api.admin.headers,
    )
    assert response.status_code == 422, response.text
    assert response.json()["type"].endswith("/job-principal-reserved")
    assert await scalar(api.runtime, "SELECT count(*) FROM clients") == clients
    delegated = await api.http.put(
        f"/v1/principals/{api.admin.principal_id}/delegates/{s.job_principal}",
        headers=api.admin.headers,
    )
    assert delegated.status_code == 422, delegated.text
    assert delegated.json()["type"].endswith("/job-principal-reserved")
    assert await scalar(api.runtime, "SELECT count(*) FROM delegations") == 0


# 5. one failing run is its own --------------------------------------------------------


async def test_one_failing_run_does_not_stop_the_worker_for_other_tenants(api: Api) -> None:
    other = await api.other_tenant()
    bad = await queue(api, SWEEP, dry_run=True)
    victim = await queue(other, SWEEP, dry_run=True)
    worker = Runner(api.runtime, {SWEEP: _failing_in(api)}, batch_size=3)
    assert await worker.pick_up() == 1  # raises nothing; the victim's run ended
    assert (await run_of(other, victim))["status"] == "finished"
    failed = await run_of(api, bad)
    assert failed["status"] == "queued"
    assert failed["error"]["slug"] == "internal-error"
    assert [r["status"] for r in await audit_rows(api, SWEEP, bad)] == [500]
    # The next poll tries the failed run again (once per poll: a blip is not a bug).
    assert await worker.pick_up() == 0
    assert [r["status"] for r in await audit_rows(api, SWEEP, bad)] == [500, 500]


async def test_one_failing_run_does_not_stop_the_cli_for_other_tenants(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = await api.other_tenant()
    monkeypatch.setitem(JOBS, SWEEP, _failing_in(api))
    out = io.StringIO()
    result = await cli.run(api.runtime, SWEEP, None, None, True, None, progress=out)
    by_tenant = {r["tenant_id"]: r for r in result["runs"]}
    assert by_tenant[other.tenant_id]["status"] == "finished"
    assert by_tenant[api.tenant_id]["status"] != "finished"
    assert by_tenant[api.tenant_id]["error"]["slug"] == "internal-error"
    assert "batch failed (RuntimeError)" in out.getvalue()


async def test_a_run_of_a_job_that_no_longer_exists_fails_audited(api: Api) -> None:
    run_id = await queue(api, SWEEP, dry_run=True)
    await Runner(api.runtime, {}, batch_size=3).run(uuid.UUID(api.tenant_id), run_id)
    body = await run_of(api, run_id)
    assert body["status"] == "failed"
    assert body["error"]["slug"] == "unknown-job"
    [row] = await audit_rows(api, SWEEP, run_id)
    assert row["status"] == 404
    assert row["reason"] == "unknown-job"
