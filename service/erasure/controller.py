"""Routes of the erasure API (`manage:erasure` and the eraser role)."""

from __future__ import annotations

from litestar import Controller, Request, Response, get, post
from litestar.background_tasks import BackgroundTask
from litestar.datastructures import ResponseHeader, State
from litestar.params import JSONBody

from service.auth.principal import Principal
from service.auth.tokens import VerifiedToken
from service.calls import Call, open_call
from service.erasure import operations as ops
from service.erasure.schemas import ErasureCreate, ErasureExecute, ErasurePlanOut, Proof, Receipt
from service.erasure.service import ErasureService, Finalisation
from service.http.deps import CallDep, Rt
from service.http.params import PathId, parse_id
from service.http.routes import route
from service.runtime import Runtime

AuthedRequest = Request[Principal, VerifiedToken, State]
NO_STORE = [ResponseHeader(name="Cache-Control", value="no-store")]


def _service(call: Call, runtime: Runtime) -> ErasureService:
    return ErasureService(call.db, runtime, facts=call.facts)


async def finalize_after(runtime: Runtime, call: Call, done: Finalisation) -> None:
    """After the execution's answer (its transaction committed): the finalisation, a call of
    its own, audited as `erasure.finalize`."""
    assert call.caller is not None
    assert call.token is not None
    async with open_call(
        runtime,
        ops.ERASURE_FINALIZE,
        token=call.token,
        caller=call.caller,
        method="POST",
        route=call.route,
    ) as finishing:
        await _service(finishing, runtime).finalize(call.caller, done)


class ErasureController(Controller):
    path = "/v1/erasures"
    tags = ["erasure"]

    @post("/", response_headers=NO_STORE, **route(ops.ERASURE_PLAN))
    async def plan_erasure(
        self, request: AuthedRequest, data: JSONBody[ErasureCreate], call: CallDep, runtime: Rt
    ) -> ErasurePlanOut:
        """Plan an erasure, changing nothing else: the rows it would erase (by id, by subject,
        by owner wherever they were filed, other versions, derived rows) and the rows that
        mention a name, to review. Execute it by id and version."""
        return await _service(call, runtime).plan(request.user, data)

    @post(
        "/{erasure_id:str}/plan",
        status_code=200,
        response_headers=NO_STORE,
        **route(ops.ERASURE_REPLAN),
    )
    async def replan_erasure(
        self, request: AuthedRequest, erasure_id: PathId, call: CallDep, runtime: Rt
    ) -> ErasurePlanOut:
        """Plan the erasure again over today's data; its version goes up by one."""
        return await _service(call, runtime).replan(request.user, parse_id(erasure_id))

    @get("/{erasure_id:str}", response_headers=NO_STORE, **route(ops.ERASURE_GET))
    async def get_erasure(
        self, request: AuthedRequest, erasure_id: PathId, call: CallDep, runtime: Rt
    ) -> ErasurePlanOut:
        """An erasure plan as it reaches today's data, or, once executed, its receipt (its
        counts per layer and erased ids are in the receipt; the lists are then empty, names
        cleared, subjects and owners as pseudonyms)."""
        return await _service(call, runtime).get(request.user, parse_id(erasure_id))

    @post("/{erasure_id:str}/execute", status_code=200, **route(ops.ERASURE_EXECUTE))
    async def execute_erasure(
        self,
        request: AuthedRequest,
        erasure_id: PathId,
        data: JSONBody[ErasureExecute],
        call: CallDep,
        runtime: Rt,
    ) -> Response[Receipt]:
        """Execute the plan at `version`, in one transaction; 409 when the data it reaches
        changed since. Answers the signed, content-free receipt (again for an executed plan).
        VACUUM and the files' second scan follow the answer: see the proof."""
        service = _service(call, runtime)
        receipt, done = await service.execute(
            request.user, request.auth.subject, parse_id(erasure_id), data.version
        )
        background = None if done is None else BackgroundTask(finalize_after, runtime, call, done)
        return Response(receipt, background=background, headers={"Cache-Control": "no-store"})

    @get("/{erasure_id:str}/proof", response_headers=NO_STORE, **route(ops.ERASURE_PROOF))
    async def erasure_proof(
        self, request: AuthedRequest, erasure_id: PathId, call: CallDep, runtime: Rt
    ) -> Proof:
        """Check the erasure now: erased rows and vectors left, rows still written by its
        owners, dangling derivations; with what the execution found (mentions left, nearest
        remaining vectors, VACUUM, and the database files' byte scan before and after, or why
        it could not look)."""
        return await _service(call, runtime).proof(request.user, parse_id(erasure_id))
