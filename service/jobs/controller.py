"""HTTP routes of the job runner: queue a run, list runs, read one (`run:jobs`)."""

from __future__ import annotations

from typing import Annotated

from litestar import Controller, Request, get, post
from litestar.datastructures import State
from litestar.params import FromPath, FromQuery, JSONBody, QueryParameter

from service.auth.principal import Principal
from service.auth.tokens import VerifiedToken
from service.calls import Call
from service.http.deps import CallDep
from service.http.params import PathId, parse_id
from service.http.routes import route
from service.jobs import operations as ops
from service.jobs.registry import JOBS
from service.jobs.schemas import RunCreate, RunOut, RunPage, RunStatus
from service.jobs.service import JobService, job_named

AuthedRequest = Request[Principal, VerifiedToken, State]


def _service(request: AuthedRequest, call: Call) -> JobService:
    return JobService(call.db, request.user.tenant_id, call.facts)


class JobController(Controller):
    path = "/v1/jobs"
    tags = ["jobs"]

    @post("/{name:str}/runs", **route(ops.START))
    async def start_run(
        self, request: AuthedRequest, name: FromPath[str], data: JSONBody[RunCreate], call: CallDep
    ) -> RunOut:
        """Queue a run of the job `name` (`memory.sweep_expired` ...) in your tenant. It runs
        as the tenant's job principal, with the grants it holds now (and still holds then),
        within the spaces you may read. A run identical to one queued or running (same job,
        space, dry_run and options) is that run: the answer is the pending run."""
        job = job_named(JOBS, name)
        cap = call.runtime.settings.jobs.max_pending
        queued = await _service(request, call).enqueue(job, data, request.user, cap=cap)
        return queued.run

    @get("/runs", **route(ops.LIST))
    async def list_runs(
        self,
        request: AuthedRequest,
        call: CallDep,
        status: FromQuery[RunStatus | None] = None,
        cursor: Annotated[
            str | None, QueryParameter(description="`next_cursor` of the previous page.")
        ] = None,
    ) -> RunPage:
        """Your tenant's job runs, newest first (50 a page): status, counts and errors."""
        return await _service(request, call).list_page(cursor, status)

    @get("/runs/{run_id:str}", **route(ops.GET))
    async def get_run(self, request: AuthedRequest, run_id: PathId, call: CallDep) -> RunOut:
        """One job run: status, cursor position (batches), counts and error."""
        return await _service(request, call).get(parse_id(run_id))
