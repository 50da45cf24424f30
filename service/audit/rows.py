"""The audit row of one call: what it holds, how it is built and appended.

Rows hold ids, pseudonyms, names of routes and operations, counts and numbers — never bodies,
query strings, tokens, secrets or driver messages. `audit_append()` (a database function) numbers
and hashes each row into its tenant's chain; every N rows a signed checkpoint follows in the same
transaction. The call (service/calls.py) decides in which transaction a row goes.
"""

from __future__ import annotations

import hashlib
import re
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog
from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY, UUID
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.types import Text

from service.audit.checkpoints import NoAuditKey, insert_checkpoint, signing_key
from service.auth.principal import Principal
from service.auth.scopes import ALL_SCOPES
from service.auth.tokens import VerifiedToken, presented_issuer
from service.db.driver import built_once, run
from service.observability.telemetry import AUDIT_APPEND_DURATION, span, timed

if TYPE_CHECKING:
    from service.calls import Call, IssuedIdentity
    from service.runtime import Runtime

PLATFORM_TENANT = uuid.UUID(int=0)
"""Calls nobody authenticated are logged here, never under the tenant a token merely claims."""
MAX_DELEGATION_DEPTH = 8

_log = structlog.get_logger("memgate.audit")

_APPEND = built_once(
    text(
        "SELECT appended_seq, appended_hash FROM audit_append("
        ":tenant_id, :request_id, :trace_id, :actor, :client_id, :delegation, :token_id, "
        ":issuer, :scopes, :method, :route, :action, :target_ids, :result_count, :decision, "
        ":reason, :status, :latency_us)"
    ).bindparams(
        bindparam("delegation", type_=ARRAY(Text)),
        bindparam("scopes", type_=ARRAY(Text)),
        bindparam("target_ids", type_=ARRAY(UUID)),
    )
)
"""Every call's last statement, run on the driver (service/db/driver.py)."""


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
        (result,) = await run(session, _APPEND, row.__dict__)
    return int(result[0]), bytes(result[1])


def decision_of(status: int) -> str:
    if status < 400:
        return "allow"
    return "deny" if status < 500 else "error"


_PLAIN_ID = re.compile(r"[A-Za-z0-9._:/-]{1,128}")


def plain_or_digest(value: str | None) -> str | None:
    """Ids from tokens are issuer text: kept when they look like ids, else a digest (an email
    in `client_id` or a token in `jti` must not land in the log)."""
    if value is None or _PLAIN_ID.fullmatch(value):
        return value
    return "sha256:" + _digest(value)


def known_scopes(scopes: Iterable[str]) -> list[str]:
    """Only scopes memgate defines: an external issuer's other scopes are free text."""
    return sorted(set(scopes) & ALL_SCOPES)


def _current_trace_id() -> str | None:
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else None


@dataclass(frozen=True)
class RowSource:
    """Everything a row needs from its call, taken when the call finishes."""

    tenant_id: uuid.UUID
    common: dict[str, Any]
    caller: Principal | None
    token: VerifiedToken | None
    issued: IssuedIdentity | None
    presented_client_id: str | None
    bearer: str

    @classmethod
    def of(cls, call: Call, status: int, reason: str | None) -> RowSource:
        facts = call.facts
        common: dict[str, Any] = {
            "request_id": call.request_id,
            "trace_id": _current_trace_id(),
            "method": call.method,
            "route": call.route,
            "action": call.action,
            "target_ids": list(dict.fromkeys(call.path_ids + facts.targets)),
            "result_count": facts.result_count if status < 400 else None,
            "decision": decision_of(status),
            "reason": reason or facts.reason or ("ok" if status < 400 else f"http-{status}"),
            "status": status,
            "latency_us": int((time.perf_counter() - call.started) * 1_000_000),
        }
        authenticated = call.caller is not None and call.token is not None
        return cls(
            tenant_id=call.chain(),
            common=common,
            caller=call.caller if authenticated else None,
            token=call.token if authenticated else None,
            issued=facts.issued,
            presented_client_id=facts.presented_client_id,
            bearer=call.bearer,
        )


async def append_row(
    session: AsyncSession, runtime: Runtime, source: RowSource, *, path: str
) -> tuple[uuid.UUID, int, bytes]:
    """Build the row (pseudonyms are looked up or made in `session`), append it, and sign a
    checkpoint when one is due. Returns (chain, seq, hash)."""
    row = AuditRow(**source.common, **(await _who(session, runtime, source)))
    seq, row_hash = await append(session, row, path=path)
    await _checkpoint_if_due(session, runtime, row.tenant_id, seq, row_hash)
    return row.tenant_id, seq, row_hash


async def _who(session: AsyncSession, runtime: Runtime, source: RowSource) -> dict[str, Any]:
    if source.caller is not None and source.token is not None:
        return await _authenticated(session, runtime, source.caller, source.token)
    issued = source.issued
    pseudonyms = runtime.pseudonyms
    if issued is not None:
        return {
            "tenant_id": issued.tenant_id,
            "actor": await pseudonyms.of(
                session, issued.tenant_id, issued.subject, issued.principal_id
            ),
            "client_id": issued.client_id,
            "delegation": [await pseudonyms.lookup(session, issued.tenant_id, issued.actor_subject)]
            if issued.actor_subject
            else [],
            "token_id": issued.token_id,
            "issuer": runtime.issuer.issuer,
            "scopes": known_scopes(issued.scopes),
        }
    return {
        "tenant_id": PLATFORM_TENANT,
        "actor": None,
        "client_id": source.presented_client_id,
        "delegation": [],
        "token_id": None,
        "issuer": _presented_issuer(runtime, source.bearer),
        "scopes": [],
    }


async def _authenticated(
    session: AsyncSession, runtime: Runtime, principal: Principal, verified: VerifiedToken
) -> dict[str, Any]:
    pseudonyms = runtime.pseudonyms
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


def _presented_issuer(runtime: Runtime, token: str) -> str | None:
    """A trusted issuer by name; anything else only as a digest (it is attacker text)."""
    iss = presented_issuer(token) if token else None
    if iss is None:
        return None
    if runtime.verifier.trusts(iss):
        return iss
    return "untrusted:" + _digest(iss)


def _digest(text: str) -> str:
    """A short digest of caller text. `surrogatepass`: a lone surrogate (a legal JSON escape in
    a token) must not make the audit row fail (red-team F4: 503 for anyone without a token)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


async def _checkpoint_if_due(
    session: AsyncSession, runtime: Runtime, tenant_id: uuid.UUID, seq: int, row_hash: bytes
) -> None:
    """Every N rows a checkpoint, in the row's own transaction (while the tenant's append lock is
    held): the tail after the newest checkpoint is bounded in rows, not only in seconds, and the
    checkpoint exists exactly when its row does.

    A checkpoint that cannot be signed (no key this process can open, a refused insert) never
    fails the call: the row is the record and the checkpoint only a later proof of it. The
    failure is logged and the timed signer signs the head on its next run."""
    every = runtime.settings.audit.checkpoint_rows
    if every <= 0 or seq % every != 0:
        return
    key = await signing_key(session, runtime.kek)
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
