"""The audit recorder: an ASGI middleware that writes exactly one audit row per HTTP call.

When the response starts (its status is known, nothing is sent yet):
- a call that succeeded (status < 400) with a database session: its row is appended in the
  request's own transaction, then both commit together;
- anything else (denied, failed, no database work): the request's transaction is rolled back and
  the row is appended in a short transaction of its own;
- if appending or committing fails, the caller gets 503 instead of the answer, and the failure
  itself is audited separately when that is still possible. A call is never answered unaudited.

Rows hold ids, pseudonyms, names of routes and actions, counts, and numbers — never bodies,
query strings, tokens, secrets or driver messages. Only routes marked `audit_exempt` (liveness,
readiness, metrics scrapes) are not recorded.
"""

from __future__ import annotations

import hashlib
import re
import time
import uuid
from collections.abc import Iterable, MutableMapping
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import structlog
from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, Scope, Send
from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY, UUID
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.types import Text

from service.audit.checkpoints import NoAuditKey, insert_checkpoint, signing_key
from service.audit.trail import AuditTrail, attach_trail
from service.auth.principal import Principal
from service.auth.scopes import ALL_SCOPES
from service.auth.tokens import VerifiedToken, presented_issuer
from service.db.tenancy import name_tenant
from service.observability.logging import request_id_of
from service.observability.telemetry import (
    AUDIT_APPEND_DURATION,
    http_method,
    route_of,
    span,
    timed,
)
from service.problems import ServiceUnavailable

if TYPE_CHECKING:
    from service.runtime import Runtime

PLATFORM_TENANT = uuid.UUID(int=0)
"""Calls nobody authenticated are logged here, never under the tenant a token merely claims."""
MAX_DELEGATION_DEPTH = 8
RECEIPT_PREFERENCE = "audit-receipt"

_log = structlog.get_logger("memgate.audit")

_APPEND = text(
    "SELECT appended_seq, appended_hash FROM audit_append("
    ":tenant_id, :request_id, :trace_id, :actor, :client_id, :delegation, :token_id, :issuer, "
    ":scopes, :method, :route, :action, :target_ids, :result_count, :decision, :reason, "
    ":status, :latency_us)"
).bindparams(
    bindparam("delegation", type_=ARRAY(Text)),
    bindparam("scopes", type_=ARRAY(Text)),
    bindparam("target_ids", type_=ARRAY(UUID)),
)


@dataclass(frozen=True)
class AuditRow:
    tenant_id: uuid.UUID
    request_id: str
    trace_id: str | None
    actor: str | None
    client_id: str | None
    delegation: list[str]
    token_id: str | None
    issuer: str | None
    scopes: list[str]
    method: str
    route: str
    action: str
    target_ids: list[uuid.UUID]
    result_count: int | None
    decision: str
    reason: str
    status: int
    latency_us: int


async def append(session: AsyncSession, row: AuditRow, *, path: str) -> tuple[int, bytes]:
    """Append one row through the database function (which numbers and hashes it)."""
    with (
        span("audit.append", {"memgate.audit.path": path}),
        timed(AUDIT_APPEND_DURATION, {"memgate.audit.path": path}),
    ):
        result = (await session.execute(_APPEND, row.__dict__)).one()
    return int(result[0]), bytes(result[1])


def decision_of(status: int) -> str:
    if status < 400:
        return "allow"
    return "deny" if status < 500 else "error"


def action_of(scope: MutableMapping[str, Any]) -> str:
    handler = scope.get("route_handler")
    action = getattr(handler, "opt", {}).get("action") if handler is not None else None
    if isinstance(action, str):
        return action
    if route_of(scope).startswith("/schema"):
        return "schema.read"
    if handler is not None and scope.get("method") == "OPTIONS":
        return "http.options"
    return "route.unmatched"


def is_exempt(scope: MutableMapping[str, Any]) -> bool:
    handler = scope.get("route_handler")
    return handler is not None and bool(getattr(handler, "opt", {}).get("audit_exempt"))


def _path_ids(scope: MutableMapping[str, Any]) -> list[uuid.UUID]:
    ids: list[uuid.UUID] = []
    for value in (scope.get("path_params") or {}).values():
        try:
            ids.append(uuid.UUID(str(value)))
        except ValueError:
            continue
    return ids


def wants_receipt(scope: MutableMapping[str, Any]) -> bool:
    """`Prefer: audit-receipt` (RFC 7240: comma-separated preferences, parameters after `;`)."""
    for name, value in scope.get("headers", []):
        if name == b"prefer":
            for preference in value.decode("latin-1").split(","):
                if preference.split(";", 1)[0].strip().lower() == RECEIPT_PREFERENCE:
                    return True
    return False


def _bearer(scope: MutableMapping[str, Any]) -> str:
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" else ""
    return ""


_PLAIN_ID = re.compile(r"[A-Za-z0-9._:/-]{1,128}")


def plain_or_digest(value: str | None) -> str | None:
    """Ids from tokens are issuer text: kept when they look like ids, else a digest (an email
    in `client_id` or a token in `jti` must not land in the log)."""
    if value is None or _PLAIN_ID.fullmatch(value):
        return value
    return "sha256:" + hashlib.sha256(value.encode()).hexdigest()[:16]


def known_scopes(scopes: Iterable[str]) -> list[str]:
    """Only scopes memgate defines: an external issuer's other scopes are free text."""
    return sorted(set(scopes) & ALL_SCOPES)


def _current_trace_id() -> str | None:
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else None


class _RowBuilder:
    def __init__(self, runtime: Runtime, trail: AuditTrail, scope: MutableMapping[str, Any]):
        self.runtime, self.trail, self.scope = runtime, trail, scope

    async def build(
        self, session: AsyncSession, status: int, reason: str | None, request_id: str
    ) -> AuditRow:
        targets = list(dict.fromkeys(_path_ids(self.scope) + self.trail.targets))
        common: dict[str, Any] = {
            "request_id": request_id,
            "trace_id": _current_trace_id(),
            "method": http_method(self.scope),
            "route": route_of(self.scope),
            "action": action_of(self.scope),
            "target_ids": targets,
            "result_count": self.trail.result_count if status < 400 else None,
            "decision": decision_of(status),
            "reason": reason or self.trail.reason or ("ok" if status < 400 else f"http-{status}"),
            "status": status,
            "latency_us": int((time.perf_counter() - self.trail.started) * 1_000_000),
        }
        return AuditRow(**common, **(await self._who(session)))

    def tenant(self) -> uuid.UUID:
        """The chain the row goes to: the caller's tenant, the tenant a token request proved,
        or the platform chain."""
        principal = self.scope.get("user")
        if isinstance(principal, Principal) and isinstance(self.scope.get("auth"), VerifiedToken):
            return principal.tenant_id
        if self.trail.issued is not None:
            return self.trail.issued.tenant_id
        return PLATFORM_TENANT

    def caller_named(self) -> bool:
        """Whether the request's transaction already names its caller (trail.py)."""
        return isinstance(self.scope.get("user"), Principal)

    async def _who(self, session: AsyncSession) -> dict[str, Any]:
        principal = self.scope.get("user")
        verified = self.scope.get("auth")
        if isinstance(principal, Principal) and isinstance(verified, VerifiedToken):
            return await self._authenticated(session, principal, verified)
        issued = self.trail.issued
        if issued is not None:
            pseudonyms = self.runtime.pseudonyms
            return {
                "tenant_id": issued.tenant_id,
                "actor": await pseudonyms.of(
                    session, issued.tenant_id, issued.subject, issued.principal_id
                ),
                "client_id": issued.client_id,
                "delegation": [
                    await pseudonyms.lookup(session, issued.tenant_id, issued.actor_subject)
                ]
                if issued.actor_subject
                else [],
                "token_id": issued.token_id,
                "issuer": self.runtime.issuer.issuer,
                "scopes": known_scopes(issued.scopes),
            }
        return {
            "tenant_id": PLATFORM_TENANT,
            "actor": None,
            "client_id": self.trail.presented_client_id,
            "delegation": [],
            "token_id": None,
            "issuer": self._presented_issuer(),
            "scopes": [],
        }

    async def _authenticated(
        self, session: AsyncSession, principal: Principal, verified: VerifiedToken
    ) -> dict[str, Any]:
        pseudonyms = self.runtime.pseudonyms
        tenant = principal.tenant_id
        delegation: list[str] = []
        act = verified.act
        while isinstance(act, dict) and len(delegation) < MAX_DELEGATION_DEPTH:
            sub = act.get("sub")
            if isinstance(sub, str):
                delegation.append(await pseudonyms.lookup(session, tenant, sub))
            act = act.get("act")
        return {
            "tenant_id": tenant,
            "actor": await pseudonyms.of(session, tenant, verified.subject, principal.principal_id),
            "client_id": plain_or_digest(principal.client_id),
            "delegation": delegation,
            "token_id": plain_or_digest(principal.token_id),
            "issuer": principal.issuer,
            "scopes": known_scopes(principal.scopes),
        }

    def _presented_issuer(self) -> str | None:
        """A trusted issuer by name; anything else only as a digest (it is attacker text)."""
        token = _bearer(self.scope)
        iss = presented_issuer(token) if token else None
        if iss is None:
            return None
        if self.runtime.verifier.trusts(iss):
            return iss
        return "untrusted:" + hashlib.sha256(iss.encode()).hexdigest()[:16]


class _Call:
    """One HTTP call's audit: finished exactly once, at response start or when the app ends."""

    def __init__(self, runtime: Runtime, scope: MutableMapping[str, Any]):
        self.runtime = runtime
        self.scope = scope
        self.trail = AuditTrail(runtime)
        self.finished = False
        self.receipt: tuple[uuid.UUID, int, bytes] | None = None
        """(chain, seq, hash) of this call's row once it committed: the chain's head then."""
        attach_trail(scope, self.trail)

    def request_id(self) -> str:
        return request_id_of(self.scope) or uuid.uuid4().hex

    async def finish(self, status: int) -> ServiceUnavailable | None:
        """Record the call. A problem means it could not be (answer that instead)."""
        self.finished = True
        session = self.trail.session
        if is_exempt(self.scope):
            await self._settle(session, commit=status < 400)
            return None
        builder = _RowBuilder(self.runtime, self.trail, self.scope)
        if status < 400 and session is not None:
            return await self._with_the_call(builder, session, status)
        await self._settle(session, commit=False)
        return None if await self._separately(builder, status, None) else NOT_RECORDED

    async def _with_the_call(
        self, builder: _RowBuilder, session: AsyncSession, status: int
    ) -> ServiceUnavailable | None:
        """The row in the call's own transaction, committed with the call's writes."""
        try:
            if not builder.caller_named():
                # `audit_append()` writes only to the tenant the transaction names; a request
                # with a caller named it when it began, and keeps it (review item 6).
                await name_tenant(session, builder.tenant())
            row = await builder.build(session, status, None, self.request_id())
            seq, row_hash = await append(session, row, path="in_request")
            await self._checkpoint_if_due(session, row.tenant_id, seq, row_hash)
        except Exception as exc:  # any failure: the call must not succeed unrecorded
            _log.error("audit_in_request_failed", error_type=type(exc).__name__)
            await self._settle(session, commit=False)
            await self._separately(builder, 503, "audit-unavailable")
            return NOT_RECORDED
        try:
            await session.commit()
        except Exception as exc:  # the reply to COMMIT was lost or refused: outcome unknown
            _log.error("audit_commit_failed", error_type=type(exc).__name__)
            await self._separately(builder, 503, "commit-unconfirmed")
            return NOT_CONFIRMED
        self.receipt = (row.tenant_id, seq, row_hash)
        return None

    async def _separately(self, builder: _RowBuilder, status: int, reason: str | None) -> bool:
        try:
            tenant = builder.tenant()
            async with (
                self._platform_slot(tenant),
                self.runtime.sessionmaker.begin() as session,
            ):
                await name_tenant(session, tenant)
                row = await builder.build(session, status, reason, self.request_id())
                seq, row_hash = await append(session, row, path="separate")
                await self._checkpoint_if_due(session, row.tenant_id, seq, row_hash)
            self.receipt = (row.tenant_id, seq, row_hash)
            return True
        except Exception as exc:  # reported to the caller as 503
            _log.error("audit_append_failed", error_type=type(exc).__name__)
            return False

    async def _checkpoint_if_due(
        self, session: AsyncSession, tenant_id: uuid.UUID, seq: int, row_hash: bytes
    ) -> None:
        """Every N rows a checkpoint, in the row's own transaction (while the tenant's append
        lock is held): the tail after the newest checkpoint is bounded in rows, not only in
        seconds, and the checkpoint exists exactly when its row does.

        A checkpoint that cannot be signed (no key this process can open, a refused insert)
        never fails the call: the row is the record and the checkpoint only a later proof of
        it. The failure is logged and the timed signer signs the head on its next run. Before,
        a key the app could not unseal made every call due a checkpoint a 503, for good."""
        every = self.runtime.settings.audit.checkpoint_rows
        if every <= 0 or seq % every != 0:
            return
        key = await signing_key(session, self.runtime.kek)
        if key is None:
            _log.error("audit_checkpoint_not_signed", seq=seq, reason=str(NoAuditKey()))
            return
        try:
            # A savepoint: a refused insert must not abort the call's transaction.
            async with session.begin_nested():
                await insert_checkpoint(session, key, tenant_id, seq, row_hash)
        except Exception as exc:
            # The type only: a driver message can quote SQL and values.
            _log.error("audit_checkpoint_not_signed", seq=seq, error_type=type(exc).__name__)

    def receipt_header(self) -> tuple[bytes, bytes] | None:
        """`Audit-Receipt` for a caller who sent `Prefer: audit-receipt`: its own row's seq and
        hash, a head it can later hold against the log. Not for the platform chain: its
        numbers would tell any anonymous caller how many calls the whole platform takes."""
        if self.receipt is None or not wants_receipt(self.scope):
            return None
        tenant_id, seq, row_hash = self.receipt
        if tenant_id == PLATFORM_TENANT:
            return None
        return b"audit-receipt", f"seq={seq}; hash={row_hash.hex()}".encode()

    def _platform_slot(self, tenant: uuid.UUID) -> AbstractAsyncContextManager[Any]:
        """Rows of calls nobody authenticated all go to the platform tenant's chain, whose lock
        appends them one at a time. A flood of refused token requests would otherwise hold a
        pool connection per row just to wait for that lock (review item 1), so they take one of
        a few slots *before* checking a connection out; rows of other chains do not wait."""
        if tenant != PLATFORM_TENANT:
            return nullcontext()
        return self.runtime.platform_audit_slots

    @staticmethod
    async def _settle(session: AsyncSession | None, *, commit: bool) -> None:
        """End the call's transaction; a failure to roll back (a dead connection) must not stop
        the call being audited, and what was not committed is gone either way."""
        if session is None or not session.in_transaction():
            return
        try:
            if commit:
                await session.commit()
            else:
                await session.rollback()
        except Exception as exc:
            _log.error("request_transaction_end_failed", error_type=type(exc).__name__)
            if commit:
                raise

    async def close(self) -> None:
        if self.trail.session is not None:
            await self.trail.session.close()


NOT_RECORDED = ServiceUnavailable(
    "The call could not be recorded in the audit log, so it was not carried out (nothing was "
    "changed). Retry later."
)
NOT_CONFIRMED = ServiceUnavailable(
    "The database did not confirm the commit of this call and its audit row, so its outcome is "
    "unknown. Read the resource before you retry a write."
)


async def _send_unavailable(send: Send, path: str, problem: ServiceUnavailable) -> None:
    import json

    body = json.dumps(problem.to_body(instance=path)).encode()
    await send(
        {
            "type": "http.response.start",
            "status": problem.status,
            "headers": [
                (b"content-type", b"application/problem+json"),
                (b"content-length", str(len(body)).encode()),
                (b"retry-after", b"1"),
                (b"cache-control", b"no-store"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


def audit_recorder(app: ASGIApp, runtime: Runtime) -> ASGIApp:
    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await app(scope, receive, send)
            return
        call = _Call(runtime, cast(MutableMapping[str, Any], scope))
        replaced = False

        async def audited_send(message: Message) -> None:
            nonlocal replaced
            if message["type"] == "http.response.start" and not call.finished:
                problem = await call.finish(message["status"])
                if problem is not None:
                    replaced = True
                    await _send_unavailable(send, scope.get("path", ""), problem)
                    return
                receipt = call.receipt_header()
                if receipt is not None:
                    headers = [*message.get("headers", ()), receipt]
                    headers.append((b"preference-applied", RECEIPT_PREFERENCE.encode()))
                    message = cast(Message, {**message, "headers": headers})
            elif replaced:
                return
            await send(message)

        try:
            await app(scope, receive, audited_send)
        finally:
            try:
                if not call.finished:  # the app ended without answering (client gone, crash)
                    await call.finish(500)
            finally:
                await call.close()

    return middleware


def check_every_route_is_audited(app: Any) -> None:
    """Refuse to build an app with a route that names no audit action: adding a route without
    deciding how it is audited fails at start-up, not in production."""
    missing: list[str] = []
    for route in app.routes:
        for handler in getattr(route, "route_handlers", []):
            if handler.opt.get("action") or handler.opt.get("audit_exempt"):
                continue
            if route.path.startswith("/schema") or handler.http_methods == {"OPTIONS"}:
                continue  # Litestar's own routes: audited as `schema.read` / `http.options`
            missing.append(f"{'/'.join(sorted(handler.http_methods))} {route.path}")
    if missing:
        raise RuntimeError(
            "every route needs opt={'action': '<feature>.<verb>'} (or 'audit_exempt'): "
            + ", ".join(missing)
        )
