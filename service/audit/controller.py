"""HTTP routes of the audit log: read, export, verify, checkpoints and their keys.

Every route needs `read:audit` and the auditor role, and sees only the caller's tenant.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from litestar import Controller, Request, Response, get
from litestar.datastructures import ResponseHeader, State
from litestar.params import FromQuery, QueryParameter

from service.audit import operations as ops
from service.audit.schemas import AuditPage, CheckpointOut, Decision, VerifyOut
from service.audit.service import MAX_EXPORT, MAX_PAGE, AuditFilters, AuditService
from service.auth.principal import Principal
from service.auth.tokens import VerifiedToken
from service.http.deps import CallDep, Rt
from service.http.params import parse_id
from service.http.routes import route

EXPORT_MEDIA_TYPE = "application/x-ndjson"
"""The export's body: one JSON object per line (what `memgate audit verify` reads)."""

AuthedRequest = Request[Principal, VerifiedToken, State]
ACTION_PATTERN = r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$"
HASH_PATTERN = r"^[0-9a-f]{64}$"

Seq = Annotated[int, QueryParameter(ge=1, le=2**62)]


def _auditor(request: AuthedRequest, call: CallDep, runtime: Rt) -> AuditService:
    """The operation's declaration has checked the scope and the auditor role."""
    return AuditService(call.db, runtime.pseudonyms, request.user, facts=call.facts)


class AuditController(Controller):
    path = "/v1/audit"
    tags = ["audit"]

    @get("/events", **route(ops.EVENTS))
    async def events(
        self,
        request: AuthedRequest,
        call: CallDep,
        runtime: Rt,
        since: FromQuery[datetime | None] = None,
        until: FromQuery[datetime | None] = None,
        actor: Annotated[
            str | None,
            QueryParameter(
                max_length=64, description="A principal id, or an actor pseudonym (64 hex)."
            ),
        ] = None,
        action: Annotated[
            str | None, QueryParameter(pattern=ACTION_PATTERN, max_length=100)
        ] = None,
        decision: FromQuery[Decision | None] = None,
        target: Annotated[
            str | None, QueryParameter(max_length=64, description="A target id (UUID).")
        ] = None,
        cursor: FromQuery[str | None] = None,
        limit: Annotated[
            int | None, QueryParameter(description=f"Page size (1-{MAX_PAGE}, default 50).")
        ] = None,
    ) -> AuditPage:
        """Your tenant's audit events, newest first, filtered by time (`since` inclusive,
        `until` exclusive), actor, action, decision and target id; cursor pagination."""
        service = _auditor(request, call, runtime)
        filters = AuditFilters(
            since=since,
            until=until,
            actor=actor,
            action=action,
            decision=decision,
            target=parse_id(target) if target is not None else None,
        )
        return await service.page(filters, cursor, limit)

    @get(
        "/export",
        media_type=EXPORT_MEDIA_TYPE,
        response_headers=[
            ResponseHeader(
                name="Audit-Next-Seq",
                description="Where to continue when more events remain (absent at the end).",
                documentation_only=True,
            )
        ],
        **route(ops.EXPORT),
    )
    async def export(
        self,
        request: AuthedRequest,
        call: CallDep,
        runtime: Rt,
        from_seq: Seq = 1,
        limit: Annotated[int | None, QueryParameter(ge=1, le=MAX_EXPORT)] = None,
    ) -> Response[bytes]:
        """Events from `from_seq` on, oldest first, one JSON object per line (with `prev_hash`
        and `row_hash`), for `memgate audit verify`. When more remain, the `Audit-Next-Seq`
        header says where to continue."""
        service = _auditor(request, call, runtime)
        body, next_seq = await service.export(from_seq, limit)
        headers = {"Cache-Control": "no-store"}
        if next_seq is not None:
            headers["Audit-Next-Seq"] = str(next_seq)
        return Response(body, media_type=EXPORT_MEDIA_TYPE, headers=headers)

    @get("/verify", **route(ops.VERIFY))
    async def verify(
        self,
        request: AuthedRequest,
        call: CallDep,
        runtime: Rt,
        from_seq: Seq = 1,
        to_seq: Annotated[int | None, QueryParameter(ge=1, le=2**62)] = None,
        known_seq: Annotated[
            int | None,
            QueryParameter(ge=1, le=2**62, description="The seq of a head you hold."),
        ] = None,
        known_hash: Annotated[
            str | None,
            QueryParameter(
                pattern=HASH_PATTERN,
                description="Its hash (64 lowercase hex), from an Audit-Receipt or a checkpoint.",
            ),
        ] = None,
    ) -> VerifyOut:
        """Recompute your tenant's hash chain over `from_seq`..`to_seq` (default: to the head;
        at most 1,000,000 rows per call) and check it against the head and every signed
        checkpoint in the range. `first_bad_seq` names the first missing, altered, duplicated
        or unchained row. With `known_seq` and `known_hash` (a head you kept), the chain must
        still hold that row: a tail cut after the newest checkpoint is found."""
        service = _auditor(request, call, runtime)
        return await service.verify(from_seq, to_seq, known_seq, known_hash)

    @get("/checkpoints/latest", **route(ops.CHECKPOINT))
    async def latest_checkpoint(
        self, request: AuthedRequest, call: CallDep, runtime: Rt
    ) -> CheckpointOut:
        """The newest signed checkpoint of your tenant's chain. Keep copies: a later rewrite of
        the log cannot match them."""
        return await (_auditor(request, call, runtime)).latest_checkpoint()

    @get("/keys", **route(ops.KEYS))
    async def keys(self, request: AuthedRequest, call: CallDep, runtime: Rt) -> dict[str, Any]:
        """The public keys (JWKS, Ed25519) that sign audit checkpoints; never token keys."""
        return await (_auditor(request, call, runtime)).keys()
