"""HTTP routes of the memory API: learn, recall, forget."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated

from litestar import Controller, Request, Response, delete, get, post
from litestar.datastructures import State
from litestar.di import NamedDependency, Provide
from litestar.params import FromQuery, HeaderParameter, JSONBody, QueryParameter

from service.auth.principal import Principal
from service.auth.tokens import VerifiedToken
from service.calls import Call
from service.http.body import BODY_CHECK
from service.http.deps import CallDep, Rt
from service.http.params import PathId, parse_id
from service.http.routes import route
from service.memory import operations as ops
from service.memory.batch import decode_batch
from service.memory.etags import parse_if_match
from service.memory.repository import MemoryFilters
from service.memory.review import Rejected, Rejection, ReviewService
from service.memory.schemas import (
    KEY_PATTERN,
    SUBJECT_PATTERN,
    GroupBy,
    Kind,
    MemoryBatch,
    MemoryBatchWritten,
    MemoryCounts,
    MemoryCreate,
    MemoryHistory,
    MemoryOut,
    MemoryPage,
    MemoryWritten,
    SearchRequest,
    SearchResult,
)
from service.memory.service import MemoryService, time_travel
from service.policy.visible import Moment
from service.runtime import Runtime
from service.tenants.settings import tenant_limits

AuthedRequest = Request[Principal, VerifiedToken, State]


def provide_filters(
    subject: Annotated[
        str | None, QueryParameter(pattern=SUBJECT_PATTERN, min_length=1, max_length=200)
    ] = None,
    kind: FromQuery[Kind | None] = None,
    key: Annotated[
        str | None, QueryParameter(pattern=KEY_PATTERN, min_length=1, max_length=200)
    ] = None,
    space_id: FromQuery[uuid.UUID | None] = None,
) -> MemoryFilters:
    """The query filters list and counts share."""
    return MemoryFilters(subject=subject, kind=kind, key=key, space_id=space_id)


AS_OF = QueryParameter(
    description='Valid time, "what was true then" (RFC 3339 with a time zone). Default: now.'
)
KNOWN_AT = QueryParameter(
    description='Record time, "what did we know then" (RFC 3339 with a time zone). Default: now.'
)


def provide_moment(
    as_of: Annotated[datetime | None, AS_OF] = None,
    known_at: Annotated[datetime | None, KNOWN_AT] = None,
) -> Moment | None:
    """The time-travel parameters get, list and history share (docs/recall.md)."""
    return time_travel(as_of, known_at)


def _service(call: Call, runtime: Runtime) -> MemoryService:
    return MemoryService(
        call.db,
        runtime.embedder,
        tenant_limits(runtime, call),
        facts=call.facts,
        quotas=runtime.quotas,
        recalls=runtime.recalls,
    )


IF_MATCH = HeaderParameter(
    name="If-Match",
    required=False,
    description="Change only while the live version of the key is this one: its ETag as the API "
    'sent it (`"<id>.<version>"`, quotes included; several, comma-separated), or `*` for "the '
    'key has a live version". Otherwise 412 `precondition-failed` naming the current ETag, and '
    "nothing changes.",
)
IfMatchHeader = Annotated[str | None, IF_MATCH]
MEMORY_IF_MATCH = HeaderParameter(
    name="If-Match",
    required=False,
    description="Change only while this is the memory named: its ETag as the API sent it "
    '(`"<id>.<version>"`, quotes included; several, comma-separated), or `*`. Otherwise 412 '
    "`precondition-failed` naming the memory's ETag, and nothing changes.",
)
MemoryIfMatchHeader = Annotated[str | None, MEMORY_IF_MATCH]
"""`If-Match` of a change of one memory that supersedes nothing (reject, revoke, reinstate)."""


def _tagged(written: MemoryWritten) -> Response[MemoryWritten]:
    """A write's answer with the new version's ETag."""
    return Response(written, status_code=201, headers={"ETag": written.memory.etag})


def _review(call: Call) -> ReviewService:
    return ReviewService(call.db, facts=call.facts)


class MemoryController(Controller):
    path = "/v1/memories"
    tags = ["memories"]
    dependencies = {
        "filters": Provide(provide_filters, sync_to_thread=False),
        "moment": Provide(provide_moment, sync_to_thread=False),
    }

    @post("/", **route(ops.WRITE))
    async def remember(
        self,
        request: AuthedRequest,
        data: JSONBody[MemoryCreate],
        call: CallDep,
        runtime: Rt,
        if_match: IfMatchHeader = None,
    ) -> Response[MemoryWritten]:
        """Write a memory into one of your spaces (default: your personal space). A memory with
        the same subject, kind and key in that space supersedes the live one; a key new to a
        subject that has others answers 409 `key-choice-required` listing them (reuse one, or
        resend with `new_key: true`)."""
        written = await _service(call, runtime).write(request.user, data, parse_if_match(if_match))
        return _tagged(written)

    @get("/", **route(ops.LIST))
    async def list_memories(
        self,
        request: AuthedRequest,
        call: CallDep,
        runtime: Rt,
        filters: NamedDependency[MemoryFilters],
        moment: NamedDependency[Moment | None],
        cursor: FromQuery[str | None] = None,
        limit: Annotated[
            int | None, QueryParameter(description="Page size (1-100, default 50).")
        ] = None,
    ) -> MemoryPage:
        """List live memories visible to you, newest first, with cursor pagination (`as_of`,
        `known_at`: the memories current at another time)."""
        return await _service(call, runtime).list_page(request.user, filters, cursor, limit, moment)

    @get("/counts", **route(ops.COUNT))
    async def count_memories(
        self,
        request: AuthedRequest,
        call: CallDep,
        runtime: Rt,
        filters: NamedDependency[MemoryFilters],
        moment: NamedDependency[Moment | None],
        group_by: FromQuery[GroupBy | None] = None,
    ) -> MemoryCounts:
        """Count the live memories visible to you, optionally per kind, space or subject (the
        largest groups first). Counts cover exactly what list and search can return."""
        return await _service(call, runtime).count(request.user, filters, group_by, moment)

    @post("/search", status_code=200, **route(ops.SEARCH))
    async def search(
        self, request: AuthedRequest, data: JSONBody[SearchRequest], call: CallDep, runtime: Rt
    ) -> SearchResult:
        """Rank the live memories visible to you by similarity to `query`; at most `k` hits, each
        with score and provenance. `min_score` lets the answer be "nothing relevant"."""
        return await _service(call, runtime).search(request.user, data)

    @get("/{memory_id:str}", **route(ops.GET))
    async def recall(
        self,
        request: AuthedRequest,
        memory_id: PathId,
        call: CallDep,
        runtime: Rt,
        moment: NamedDependency[Moment | None],
    ) -> Response[MemoryOut]:
        """Get one memory by id (superseded versions included, with their links; with `as_of`
        or `known_at`, only if that version existed then). `ETag`: this version's."""
        found = await _service(call, runtime).get(request.user, parse_id(memory_id), moment)
        return Response(found, headers={"ETag": found.etag})

    @get("/{memory_id:str}/history", **route(ops.HISTORY))
    async def history(
        self,
        request: AuthedRequest,
        memory_id: PathId,
        call: CallDep,
        runtime: Rt,
        moment: NamedDependency[Moment | None],
        cursor: FromQuery[str | None] = None,
        limit: Annotated[
            int | None, QueryParameter(description="Versions per page (1-100, default 50).")
        ] = None,
    ) -> MemoryHistory:
        """The version chain of a memory, newest first, each version checked as you see it; it
        stops at the first version you cannot see. Deleted versions appear as stubs."""
        return await _service(call, runtime).history(
            request.user, parse_id(memory_id), cursor, limit, moment
        )

    @post("/{memory_id:str}/revert", **route(ops.REVERT))
    async def revert(
        self,
        request: AuthedRequest,
        memory_id: PathId,
        call: CallDep,
        runtime: Rt,
        if_match: IfMatchHeader = None,
    ) -> Response[MemoryWritten]:
        """Bring back an earlier version: its value is written again as a new version that
        supersedes the live one of its key (the ordinary write path and its checks)."""
        precondition = parse_if_match(if_match)
        written = await _service(call, runtime).revert(
            request.user, parse_id(memory_id), precondition
        )
        return _tagged(written)

    @delete("/{memory_id:str}", **route(ops.DELETE))
    async def forget(
        self,
        request: AuthedRequest,
        memory_id: PathId,
        call: CallDep,
        runtime: Rt,
        if_match: IfMatchHeader = None,
    ) -> None:
        """Delete one memory. Needs `delete:memory`; `write:memory` does not imply it."""
        precondition = parse_if_match(if_match)
        await _service(call, runtime).delete(request.user, parse_id(memory_id), precondition)


@post(
    "/v1/memories:batch",
    tags=["memories"],
    **route(ops.WRITE_BATCH, opt={BODY_CHECK: decode_batch}),
)
async def remember_many(
    request: AuthedRequest,
    data: JSONBody[MemoryBatch],
    call: CallDep,
    runtime: Rt,
) -> MemoryBatchWritten:
    """Write several memories in one transaction, each exactly as `POST /v1/memories` would,
    in order, or none: any failing item answers 422 `batch-rejected` listing every failing
    item. One audit row for the call, with its counts."""
    return await _service(call, runtime).write_batch(request.user, data)


@get("/v1/spaces/{space_id:str}/proposals", tags=["memories"], **route(ops.LIST_PROPOSALS))
async def list_proposals(
    request: AuthedRequest,
    space_id: PathId,
    call: CallDep,
    cursor: FromQuery[str | None] = None,
    limit: Annotated[
        int | None, QueryParameter(description="Page size (1-100, default 50).")
    ] = None,
) -> MemoryPage:
    """The proposals waiting for review in a space you review, newest first, with cursor
    pagination (a space you cannot see: 404; one you see but do not review: 403)."""
    return await _review(call).list_proposals(request.user, parse_id(space_id), cursor, limit)


@post(
    "/v1/memories/{memory_id:str}/approve",
    tags=["memories"],
    status_code=200,
    **route(ops.APPROVE),
)
async def approve_proposal(
    request: AuthedRequest,
    memory_id: PathId,
    call: CallDep,
    if_match: IfMatchHeader = None,
) -> MemoryWritten:
    """Approve a proposal: it becomes the live version of its key, superseding the live one
    as any write does, numbered after the key's newest version. `If-Match` names the live
    version of the key the proposal supersedes (not the proposal)."""
    precondition = parse_if_match(if_match)
    return await _review(call).approve(request.user, parse_id(memory_id), precondition)


@post(
    "/v1/memories/{memory_id:str}/reject",
    tags=["memories"],
    status_code=200,
    **route(ops.REJECT),
)
async def reject_proposal(
    request: AuthedRequest,
    memory_id: PathId,
    data: JSONBody[Rejection],
    call: CallDep,
    if_match: MemoryIfMatchHeader = None,
) -> Rejected:
    """Reject a proposal with a reason: it becomes a tombstone no read returns, and the same
    text (ignoring case and white space) cannot be proposed into that space again. `If-Match`
    names the proposal itself."""
    precondition = parse_if_match(if_match)
    return await _review(call).reject(request.user, parse_id(memory_id), data, precondition)
