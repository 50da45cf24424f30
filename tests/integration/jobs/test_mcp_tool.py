"""`request_consolidation` with the official MCP client: the same operation as
`POST /v1/jobs/memory.consolidate/runs` with `options.subject`, for `run:jobs` holders only."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from service.auth.scopes import Scope
from service.jobs.declare import Batch, BatchDone, Job
from service.jobs.principals import job_principal_id
from service.jobs.registry import JOBS
from service.operations import OPERATIONS, operation
from service.runtime import Runtime
from tests.fixtures.api import Api
from tests.integration.jobs.support import audit_rows, run_of, runner, setup
from tests.integration.mcp.support import error_text, mcp_session, payload, serving
from tests.integration.memory.support import scalar

CONSOLIDATE = "memory.consolidate"
SEEN: list[str] = []


async def _note_subject(batch: Batch) -> BatchDone:
    SEEN.append(batch.scope.options["subject"])
    return BatchDone({"subjects": 1}, None)


@pytest.fixture
def consolidate() -> Iterator[Job]:
    """The real consolidation job when this branch has it, else a stand-in of the same name
    that notes the subject it was asked for (removed again after the test)."""
    if CONSOLIDATE in JOBS:
        yield JOBS[CONSOLIDATE]
        return
    stand_in = Job(
        operation(CONSOLIDATE, "consolidateMemories", "stand-in", Scope.RUN_JOBS),
        _note_subject,
        options=frozenset({"subject"}),
    )
    JOBS[CONSOLIDATE] = stand_in
    try:
        yield stand_in
    finally:
        del JOBS[CONSOLIDATE]
        del OPERATIONS[CONSOLIDATE]


async def test_request_consolidation_queues_a_run_for_the_subject(
    api: Api, runtime: Runtime, consolidate: Job
) -> None:
    s = await setup(api, job_actions=("read", "write", "delete"))
    agent = await api.new_agent("alice")
    async with serving(runtime) as base:
        async with mcp_session(base, api.admin.token) as session:
            queued = payload(
                await session.call_tool("request_consolidation", {"subject": "service:search"})
            )
            bad = await session.call_tool("request_consolidation", {"subject": "has space"})
            unknown = await session.call_tool(
                "request_consolidation", {"subject": "service:search", "everything": True}
            )
        async with mcp_session(base, agent.token) as session:
            refused = await session.call_tool(
                "request_consolidation", {"subject": "service:search"}
            )
    assert queued["job"] == CONSOLIDATE
    assert queued["status"] == "queued"
    assert queued["options"] == {"subject": "service:search"}
    assert queued["principal_id"] == str(job_principal_id(uuid.UUID(api.tenant_id)))
    assert queued["enqueued_by"] == api.admin.principal_id
    assert "invalid-request" in error_text(bad)
    assert "invalid-request" in error_text(unknown)
    assert "insufficient-scope" in error_text(refused)
    assert "run:jobs" in error_text(refused)
    # Only the one good request (and the setup's dry run) queued anything.
    assert await scalar(runtime, "SELECT count(*) FROM job_runs WHERE job = :j", j=CONSOLIDATE) == 1
    run_id = uuid.UUID(queued["id"])
    rows = await audit_rows(api, "jobs.start", run_id)
    assert [(r["status"], r["decision"]) for r in rows] == [(202, "allow")]
    if consolidate.run_batch is _note_subject:
        SEEN.clear()
        await runner(api, {CONSOLIDATE: consolidate}).run(s.tenant, run_id)
        assert SEEN == ["service:search"]
        assert (await run_of(api, run_id))["status"] == "finished"
