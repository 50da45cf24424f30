"""Reading, exporting and verifying a tenant's audit log (the caller's tenant only)."""

from __future__ import annotations

import base64
import json
import re
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar, cast

import msgspec
from joserfc.jwk import KeySet
from sqlalchemy import Select, select
from sqlalchemy.ext.asyncio import AsyncSession

from service.audit.checkpoints import key_set, public_keys, signs, verify_signature
from service.audit.problems import AuditFilterInvalid, NoCheckpoint
from service.audit.pseudonyms import Pseudonyms
from service.audit.schemas import (
    AuditEventOut,
    AuditPage,
    CheckpointOut,
    CheckpointVerdict,
    Decision,
    VerifyOut,
)
from service.audit.verify import verify_range
from service.auth.principal import Principal
from service.calls import Facts
from service.db.models import (
    AuditActor,
    AuditCheckpoint,
    AuditEvent,
    AuditHead,
    AuditSigningKey,
)
from service.problems import BadCursor

MAX_PAGE = 200
DEFAULT_PAGE = 50
MAX_EXPORT = 50_000
_PSEUDONYM = re.compile(r"[0-9a-f]{64}")
_MAX_CURSOR_CHARS = 100
_LATEST_PAGE = 50
T = TypeVar("T")


@dataclass(frozen=True)
class AuditFilters:
    since: datetime | None = None
    until: datetime | None = None
    actor: str | None = None
    """A principal id, or a 64-hex pseudonym."""
    action: str | None = None
    decision: str | None = None
    target: uuid.UUID | None = None


def to_out(row: AuditEvent) -> AuditEventOut:
    """The row as stored. A superuser may have nulled a column the append function always
    fills; it is answered as null (verify reports the row) rather than failing the whole page
    or export, which an auditor needs most exactly then."""
    return AuditEventOut(
        tenant_id=row.tenant_id,
        seq=row.seq,
        at=row.at,
        request_id=row.request_id,
        trace_id=row.trace_id,
        actor=row.actor,
        client_id=row.client_id,
        delegation=_as_stored(row.delegation),
        token_id=row.token_id,
        issuer=row.issuer,
        scopes=_as_stored(row.scopes),
        method=row.method,
        route=row.route,
        action=row.action,
        target_ids=_as_stored(row.target_ids),
        result_count=row.result_count,
        decision=cast(Decision, row.decision),  # the append function allows only these
        reason=row.reason,
        status=row.status,
        latency_us=row.latency_us,
        policy_version=row.policy_version,
        prev_hash=_hex(row.prev_hash),
        row_hash=_hex(row.row_hash),
    )


def _hex(value: bytes | None) -> str | None:
    return bytes(value).hex() if value is not None else None


def _as_stored(values: list[T] | None) -> list[T]:
    # None passes through (see to_out); msgspec encodes without re-validating the struct.
    return cast("list[T]", None) if values is None else list(values)


def encode_cursor(before_seq: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"v": 1, "before": before_seq}).encode()).decode()


def decode_cursor(cursor: str) -> int:
    if len(cursor) > _MAX_CURSOR_CHARS:
        cursor = ""  # no cursor this API returns is that long; refuse without parsing it
    try:
        payload = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        before = payload["before"] if payload.get("v") == 1 else None
    except (ValueError, TypeError, KeyError, AttributeError, UnicodeError, RecursionError):
        before = None
    if not isinstance(before, int) or isinstance(before, bool) or before < 1:
        raise BadCursor(
            "The 'cursor' is not one this API returned. Pass 'next_cursor' from the previous "
            "page unchanged, or omit it to start from the newest event."
        )
    return before


class AuditService:
    def __init__(
        self, session: AsyncSession, pseudonyms: Pseudonyms, principal: Principal, *, facts: Facts
    ):
        self.session = session
        self.facts = facts
        self.pseudonyms = pseudonyms
        self.tenant_id = principal.tenant_id
        self.principal = principal

    async def page(self, filters: AuditFilters, cursor: str | None, limit: int | None) -> AuditPage:
        size = _page_size(limit)
        query = await self._filtered(filters)
        if cursor:
            query = query.where(AuditEvent.seq < decode_cursor(cursor))
        rows = (
            await self.session.scalars(
                query.order_by(AuditEvent.seq.desc(), AuditEvent.at.desc()).limit(size + 1)
            )
        ).all()
        more = len(rows) > size
        items = [to_out(row) for row in rows[:size]]
        self.facts.count(len(items))
        return AuditPage(items=items, next_cursor=encode_cursor(items[-1].seq) if more else None)

    async def export(self, from_seq: int, limit: int | None) -> tuple[bytes, int | None]:
        """Newline-delimited JSON of events from `from_seq` on, oldest first, and the seq to
        continue from (None at the end)."""
        size = min(limit or MAX_EXPORT, MAX_EXPORT)
        rows = (
            await self.session.scalars(
                select(AuditEvent)
                .where(AuditEvent.tenant_id == self.tenant_id, AuditEvent.seq >= from_seq)
                .order_by(AuditEvent.seq, AuditEvent.at)
                .limit(size + 1)
            )
        ).all()
        body = b"".join(msgspec.json.encode(to_out(row)) + b"\n" for row in rows[:size])
        self.facts.count(min(len(rows), size))
        return body, (rows[size].seq if len(rows) > size else None)

    async def verify(
        self,
        from_seq: int,
        to_seq: int | None,
        known_seq: int | None = None,
        known_hash: str | None = None,
    ) -> VerifyOut:
        if (known_seq is None) != (known_hash is None):
            raise AuditFilterInvalid(
                "'known_seq' and 'known_hash' go together: pass both (the 'seq' and 'hash' of "
                "an Audit-Receipt or a checkpoint you hold) or neither."
            )
        known = (known_seq, bytes.fromhex(known_hash)) if known_seq and known_hash else None
        report = await verify_range(self.session, self.tenant_id, from_seq, to_seq, known)
        verdict = report.checkpoint
        self.facts.count(report.checked)
        return VerifyOut(
            ok=report.ok,
            from_seq=report.from_seq,
            to_seq=report.to_seq,
            checked=report.checked,
            first_bad_seq=report.first_bad_seq,
            reason=report.reason,
            head_seq=report.head_seq,
            head_hash=report.head_hash.hex() if report.head_hash else None,
            checkpoint=CheckpointVerdict(
                seq=verdict.seq,
                hash=verdict.row_hash.hex(),
                jws=verdict.jws,
                signature_valid=verdict.signature_valid,
                matches_chain=verdict.matches_chain,
            )
            if verdict
            else None,
            unsigned_checkpoints=report.unsigned,
        )

    async def latest_checkpoint(self) -> CheckpointOut:
        """The newest checkpoint whose signature verifies (a row without one is not handed out
        as a checkpoint; verify reports it), however many unsigned rows lie above it.

        Only rows under a published audit key and at or below the head are candidates (junk
        planted past the head, or under a made-up kid, costs no signature check), judged a page
        at a time: a fixed window of the top 20 rows let 20 junk rows hide every real one."""
        keys = key_set(await public_keys(self.session))
        head = select(AuditHead.seq).where(AuditHead.tenant_id == self.tenant_id)
        query = (
            select(AuditCheckpoint)
            .where(
                AuditCheckpoint.tenant_id == self.tenant_id,
                AuditCheckpoint.kid.in_(select(AuditSigningKey.kid)),
                AuditCheckpoint.seq <= head.scalar_subquery(),
            )
            .order_by(AuditCheckpoint.seq.desc())
            .limit(_LATEST_PAGE)
        )
        row: AuditCheckpoint | None = None
        below: int | None = None
        while row is None:
            page = (
                await self.session.scalars(
                    query if below is None else query.where(AuditCheckpoint.seq < below)
                )
            ).all()
            if not page:
                raise NoCheckpoint(
                    "No checkpoint has been signed for this tenant yet; retry later."
                )
            row = next((c for c in page if self._signed(c, keys)), None)
            below = page[-1].seq
        return CheckpointOut(
            tenant_id=row.tenant_id,
            seq=row.seq,
            hash=_hex(row.row_hash) or "",  # _signed: it matched a signed hash
            signed_at=row.signed_at,
            kid=row.kid,
            jws=row.jws,
        )

    def _signed(self, row: AuditCheckpoint, keys: KeySet) -> bool:
        return signs(
            verify_signature(row.jws or "", keys),
            self.tenant_id,
            row.seq,
            bytes(row.row_hash or b""),
        )

    async def keys(self) -> dict[str, Any]:
        return await public_keys(self.session)

    async def _filtered(self, filters: AuditFilters) -> Select[AuditEvent]:
        query = select(AuditEvent).where(AuditEvent.tenant_id == self.tenant_id)
        if filters.since is not None:
            query = query.where(AuditEvent.at >= filters.since)
        if filters.until is not None:
            query = query.where(AuditEvent.at < filters.until)
        if filters.action is not None:
            query = query.where(AuditEvent.action == filters.action)
        if filters.decision is not None:
            query = query.where(AuditEvent.decision == filters.decision)
        if filters.target is not None:
            query = query.where(AuditEvent.target_ids.contains([filters.target]))
        if filters.actor is not None:
            query = query.where(AuditEvent.actor.in_(await self._pseudonyms_of(filters.actor)))
        return query

    async def _pseudonyms_of(self, actor: str) -> list[str]:
        if _PSEUDONYM.fullmatch(actor):
            return [actor]
        try:
            principal_id = uuid.UUID(actor)
        except ValueError:
            raise AuditFilterInvalid(
                "'actor' must be a principal id (UUID) or a 64-hex-digit pseudonym."
            ) from None
        mapped = (
            await self.session.scalars(
                select(AuditActor.pseudonym).where(
                    AuditActor.tenant_id == self.tenant_id,
                    AuditActor.principal_id == principal_id,
                )
            )
        ).all()
        return list(mapped)


def _page_size(limit: int | None) -> int:
    if limit is None:
        return DEFAULT_PAGE
    if not 1 <= limit <= MAX_PAGE:
        raise AuditFilterInvalid(f"'limit' must be between 1 and {MAX_PAGE}.")
    return limit
