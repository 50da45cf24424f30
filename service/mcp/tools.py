"""The MCP tools, each an existing operation: `@tool(op, name=..., arguments=...)`.

A tool takes its arguments as a msgspec struct — REST's own request struct where REST has a
body — decoded strictly, and calls the same service method as the REST route, so it answers
with the same JSON and the same problems. Its input schema in `tools/list` is derived from that
struct. A tool whose operation is not declared fails at start-up
(`check_every_tool_is_an_operation`), as a route does. When a later operation (history,
revoke, erasure …) gets a tool, it is one more function here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec

from service.auth.principal import Principal
from service.calls import Call
from service.http.params import parse_id
from service.jobs import operations as job_ops
from service.jobs.registry import JOBS
from service.jobs.schemas import RunCreate
from service.jobs.service import JobService, job_named
from service.mcp.schemas import (
    ConsolidationArguments,
    CountArguments,
    HistoryArguments,
    ListArguments,
    MemoryAt,
    MemoryChange,
    MemoryRef,
    ProposalsArguments,
    RejectArguments,
    RememberArguments,
)
from service.memory import operations as memory_ops
from service.memory.etags import parse_if_match
from service.memory.review import Rejection, ReviewService
from service.memory.schemas import MemoryBatch, SearchRequest
from service.memory.service import MemoryService, time_travel
from service.operations import OPERATIONS, Operation
from service.revocation import operations as revocation_ops
from service.revocation.schemas import RevokeArguments
from service.revocation.service import RevocationService
from service.runtime import Runtime
from service.tenants.settings import tenant_limits

ArgsT = TypeVar("ArgsT", bound=msgspec.Struct)
IDEMPOTENCY_KEY = "idempotency_key"
"""The argument every tool of an `idempotent` operation takes besides its own (REST's
`Idempotency-Key` header); the tool runner claims and keeps it (service/mcp/server.py)."""
IDEMPOTENCY_KEY_SCHEMA = {
    "type": "string",
    "minLength": 1,
    "maxLength": 200,
    "pattern": "^[\\x21-\\x7e]+$",
    "description": "Makes a retry safe: the same key with the same arguments within 24 hours "
    "answers the first answer again, changing nothing; with other arguments 422 "
    "`idempotency-key-reused`; while the first call runs 409 `idempotency-key-in-flight`. "
    "A UUID will do.",
}
Run = Callable[[Call, Runtime, Any], Awaitable[msgspec.Struct | dict[str, Any]]]


@dataclass(frozen=True)
class Tool:
    name: str
    operation: Operation
    description: str
    arguments: type[msgspec.Struct]
    run: Run
    read_only: bool
    destructive: bool = False

    def input_schema(self) -> dict[str, Any]:
        """JSON Schema of the arguments, with the struct itself at the root (MCP wants an
        object there) and the structs it nests under `$defs`."""
        name = self.arguments.__name__
        _, components = msgspec.json.schema_components(
            [self.arguments], ref_template="#/$defs/{name}"
        )
        root: dict[str, Any] = dict(components.pop(name))
        root.pop("title", None)
        if self.operation.idempotent:
            root["properties"] = {**root["properties"], IDEMPOTENCY_KEY: IDEMPOTENCY_KEY_SCHEMA}
        if components:
            root["$defs"] = components
        return root


TOOLS: dict[str, Tool] = {}
"""Every tool by name, in declaration order (the order of `tools/list`)."""


def tool(
    operation: Operation,
    *,
    name: str,
    arguments: type[ArgsT],
    read_only: bool,
    destructive: bool = False,
) -> Callable[[Callable[[Call, Runtime, ArgsT], Awaitable[Any]]], Tool]:
    """Register a tool serving `operation`; the function's docstring is its description."""

    def register(run: Callable[[Call, Runtime, ArgsT], Awaitable[Any]]) -> Tool:
        if name in TOOLS:
            raise TypeError(f"tool {name!r} is declared twice")
        scope = f" Needs the `{operation.scope}` scope." if operation.scope else ""
        declared = Tool(
            name=name,
            operation=operation,
            description=" ".join((run.__doc__ or operation.summary).split()) + scope,
            arguments=arguments,
            run=run,
            read_only=read_only,
            destructive=destructive,
        )
        TOOLS[name] = declared
        return declared

    return register


def check_every_tool_is_an_operation() -> None:
    """Refuse to serve a tool whose operation is not a declared one (the MCP twin of
    `check_every_route_is_an_operation`): its scope, audit action and problems come from it."""
    stray = [
        f"{t.name} ({t.operation.name})"
        for t in TOOLS.values()
        if OPERATIONS.get(t.operation.name) is not t.operation or t.operation.public
    ]
    if stray:
        raise RuntimeError(
            "every MCP tool must serve a declared, non-public Operation (service/operations.py): "
            + ", ".join(stray)
        )


def _memories(call: Call, runtime: Runtime) -> MemoryService:
    return MemoryService(
        call.db,
        runtime.embedder,
        tenant_limits(runtime, call),
        facts=call.facts,
        quotas=runtime.quotas,
        recalls=runtime.recalls,
    )


def _caller(call: Call) -> Principal:
    assert call.caller is not None  # tool calls are opened for an authenticated caller only
    return call.caller


@tool(memory_ops.WRITE, name="remember", arguments=RememberArguments, read_only=False)
async def remember(call: Call, runtime: Runtime, data: RememberArguments) -> msgspec.Struct:
    """Write a memory into one of your spaces (default: your personal space). A memory with
    the same subject, kind and key in that space supersedes the live one; a key new to a
    subject that has others answers 409 `key-choice-required` listing them (reuse one, or
    resend with `new_key: true`)."""
    return await _memories(call, runtime).write(
        _caller(call), data.body(), parse_if_match(data.if_match)
    )


@tool(memory_ops.WRITE_BATCH, name="remember_many", arguments=MemoryBatch, read_only=False)
async def remember_many(call: Call, runtime: Runtime, data: MemoryBatch) -> msgspec.Struct:
    """Write several memories (each item as `remember` takes it) in one transaction, in order,
    or none: any failing item answers 422 `batch-rejected` listing every failing item."""
    return await _memories(call, runtime).write_batch(_caller(call), data)


@tool(memory_ops.SEARCH, name="recall", arguments=SearchRequest, read_only=True)
async def recall(call: Call, runtime: Runtime, data: SearchRequest) -> msgspec.Struct:
    """Rank the live memories visible to you by similarity to `query`; at most `k` hits, each
    with score and provenance. `min_score` lets the answer be "nothing relevant"."""
    return await _memories(call, runtime).search(_caller(call), data)


@tool(memory_ops.GET, name="get_memory", arguments=MemoryAt, read_only=True)
async def get_memory(call: Call, runtime: Runtime, data: MemoryAt) -> msgspec.Struct:
    """Get one memory by id (superseded versions included, with their links; with `as_of`
    or `known_at`, only if that version existed then)."""
    moment = time_travel(data.as_of, data.known_at)
    return await _memories(call, runtime).get(_caller(call), parse_id(data.id), moment)


@tool(memory_ops.HISTORY, name="memory_history", arguments=HistoryArguments, read_only=True)
async def memory_history(call: Call, runtime: Runtime, data: HistoryArguments) -> msgspec.Struct:
    """The version chain of a memory, newest first, each version checked as you see it; it
    stops at the first version you cannot see. Deleted versions appear as stubs (status
    `retracted`). `as_of`/`known_at` show the chain as it stood then."""
    moment = time_travel(data.as_of, data.known_at)
    return await _memories(call, runtime).history(
        _caller(call), parse_id(data.id), data.cursor, data.limit, moment
    )


@tool(memory_ops.REVERT, name="revert_memory", arguments=MemoryChange, read_only=False)
async def revert_memory(call: Call, runtime: Runtime, data: MemoryChange) -> msgspec.Struct:
    """Bring back an earlier version (its id, from memory_history): its value is written
    again as a new version that supersedes the live one of its key."""
    precondition = parse_if_match(data.if_match)
    return await _memories(call, runtime).revert(_caller(call), parse_id(data.id), precondition)


@tool(memory_ops.LIST, name="list_memories", arguments=ListArguments, read_only=True)
async def list_memories(call: Call, runtime: Runtime, data: ListArguments) -> msgspec.Struct:
    """List live memories visible to you, newest first, with cursor pagination (`as_of`,
    `known_at`: the memories current at another time)."""
    moment = time_travel(data.as_of, data.known_at)
    return await _memories(call, runtime).list_page(
        _caller(call), data.filters(), data.cursor, data.limit, moment
    )


@tool(memory_ops.COUNT, name="count_memories", arguments=CountArguments, read_only=True)
async def count_memories(call: Call, runtime: Runtime, data: CountArguments) -> msgspec.Struct:
    """Count the live memories visible to you, optionally per kind, space or subject (the
    largest groups first). Counts cover exactly what list and recall can return."""
    moment = time_travel(data.as_of, data.known_at)
    return await _memories(call, runtime).count(
        _caller(call), data.filters(), data.group_by, moment
    )


@tool(memory_ops.DELETE, name="forget", arguments=MemoryChange, read_only=False, destructive=True)
async def forget(call: Call, runtime: Runtime, data: MemoryChange) -> dict[str, Any]:
    """Delete one memory version by id (`write:memory` does not imply delete). It stays in
    the history as a stub that keeps its number."""
    memory_id = parse_id(data.id)
    precondition = parse_if_match(data.if_match)
    await _memories(call, runtime).delete(_caller(call), memory_id, precondition)
    return {"deleted": str(memory_id)}


# Review (docs/concepts.md, "Review"): the reviewer's side; a writer sees its own proposals
# through get_memory and list_memories (status `proposed`).
@tool(
    memory_ops.LIST_PROPOSALS, name="list_proposals", arguments=ProposalsArguments, read_only=True
)
async def list_proposals(call: Call, runtime: Runtime, data: ProposalsArguments) -> msgspec.Struct:
    """The proposals waiting for review in a space you review, newest first, with cursor
    pagination."""
    return await ReviewService(call.db, facts=call.facts).list_proposals(
        _caller(call), parse_id(data.space_id), data.cursor, data.limit
    )


@tool(memory_ops.APPROVE, name="approve", arguments=MemoryRef, read_only=False)
async def approve(call: Call, runtime: Runtime, data: MemoryRef) -> msgspec.Struct:
    """Approve a proposal (its id, from list_proposals): it becomes the live version of its
    key, superseding the live one."""
    return await ReviewService(call.db, facts=call.facts).approve(
        _caller(call), parse_id(data.id), parse_if_match(data.if_match)
    )


@tool(memory_ops.REJECT, name="reject", arguments=RejectArguments, read_only=False)
async def reject(call: Call, runtime: Runtime, data: RejectArguments) -> msgspec.Struct:
    """Reject a proposal with a reason: it becomes a tombstone, and the same text cannot be
    proposed into that space again."""
    return await ReviewService(call.db, facts=call.facts).reject(
        _caller(call),
        parse_id(data.id),
        Rejection(reason=data.reason),
        parse_if_match(data.if_match),
    )


@tool(
    revocation_ops.REVOKE,
    name="revoke",
    arguments=RevokeArguments,
    read_only=False,
    destructive=True,
)
async def revoke(call: Call, runtime: Runtime, data: RevokeArguments) -> msgspec.Struct:
    """Revoke one memory version with a reason (which may not quote it): it, its re-writes
    in its space and every memory derived from them reach no reader again until reinstated."""
    return await RevocationService(call.db, facts=call.facts).revoke(
        _caller(call), parse_id(data.id), data.reason, parse_if_match(data.if_match)
    )


@tool(revocation_ops.REINSTATE, name="reinstate", arguments=RevokeArguments, read_only=False)
async def reinstate(call: Call, runtime: Runtime, data: RevokeArguments) -> msgspec.Struct:
    """Reinstate a revoked memory with a reason: what its revocation hid comes back. Only
    the revoked memory itself can be reinstated (not a hidden copy or derived memory)."""
    return await RevocationService(call.db, facts=call.facts).reinstate(
        _caller(call), parse_id(data.id), data.reason, parse_if_match(data.if_match)
    )


CONSOLIDATE = "memory.consolidate"


@tool(
    job_ops.START, name="request_consolidation", arguments=ConsolidationArguments, read_only=False
)
async def request_consolidation(
    call: Call, runtime: Runtime, data: ConsolidationArguments
) -> msgspec.Struct:
    """Queue a consolidation of one subject: summaries per space of what is known about it,
    each readable only by those who can read every input. It runs later, as the tenant's job
    principal (not as you); the answer is the queued run (poll `GET /v1/jobs/runs/{id}`)."""
    job = job_named(JOBS, CONSOLIDATE)
    caller = _caller(call)
    request = RunCreate(
        space_id=data.space_id, dry_run=data.dry_run, options={"subject": data.subject}
    )
    cap = runtime.settings.jobs.max_pending
    queued = await JobService(call.db, caller.tenant_id, call.facts).enqueue(
        job, request, caller, cap=cap
    )
    return queued.run
