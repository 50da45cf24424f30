"""HTTP routes of revoke and reinstate."""

from __future__ import annotations

from litestar import Request, post
from litestar.datastructures import State
from litestar.params import JSONBody

from service.auth.principal import Principal
from service.auth.tokens import VerifiedToken
from service.http.deps import CallDep
from service.http.params import PathId, parse_id
from service.http.routes import route
from service.memory.controller import MemoryIfMatchHeader
from service.memory.etags import parse_if_match
from service.revocation import operations as ops
from service.revocation.schemas import Reinstated, Revoked, RevokeRequest
from service.revocation.service import RevocationService

AuthedRequest = Request[Principal, VerifiedToken, State]


@post(
    "/v1/memories/{memory_id:str}/revoke", tags=["memories"], status_code=200, **route(ops.REVOKE)
)
async def revoke_memory(
    request: AuthedRequest,
    memory_id: PathId,
    data: JSONBody[RevokeRequest],
    call: CallDep,
    if_match: MemoryIfMatchHeader = None,
) -> Revoked:
    """Revoke one memory version with a reason: it, every memory of its space with the same
    normalized content (now and written later) and every memory derived from one of them
    reach no reader again, on any surface, until it is reinstated. Needs `delete:memory`.
    `If-Match` names the memory itself."""
    return await RevocationService(call.db, facts=call.facts).revoke(
        request.user, parse_id(memory_id), data.reason, parse_if_match(if_match)
    )


@post(
    "/v1/memories/{memory_id:str}/reinstate",
    tags=["memories"],
    status_code=200,
    **route(ops.REINSTATE),
)
async def reinstate_memory(
    request: AuthedRequest,
    memory_id: PathId,
    data: JSONBody[RevokeRequest],
    call: CallDep,
    if_match: MemoryIfMatchHeader = None,
) -> Reinstated:
    """Reinstate a revoked memory with a reason: what its revocation hid comes back (a memory
    also hidden by another revocation stays hidden). Only the revoked memory itself can be
    reinstated, not a hidden copy or a derived memory. `If-Match` names the memory itself."""
    return await RevocationService(call.db, facts=call.facts).reinstate(
        request.user, parse_id(memory_id), data.reason, parse_if_match(if_match)
    )
