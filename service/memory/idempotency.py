"""Idempotency keys of the batch write: a retried `POST /v1/memories:batch` writes nothing twice.

A key is scoped to (tenant, principal, client). The stored answer is written in the batch's own
transaction, so it exists exactly when the batch committed; a batch that failed, was refused or
whose process died leaves nothing, and the key can be used again. While a call with the key runs
it holds a transaction-level advisory lock named after the key: a second call with it answers
409 `idempotency-key-in-flight` instead of waiting or writing. Keys live `TTL`; an expired one is
as good as unused, and the next keyed batch of the tenant deletes up to `SWEEP` of them.

A stored answer is a copy of memory values, so it is replayed only while the caller could get
them now: every memory it names still readable by the caller through Visible (live or an
earlier version, not expired, revoked, retracted or deleted), in a space the caller may still
write (service/memory/service.py `_replay`). Otherwise the key answers 410, as when a trigger
dropped the body (a memory deleted, retracted, revoked or expired in place).
"""

from __future__ import annotations

import hashlib
import re
import uuid
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import ColumnElement, and_, delete, func, select, tuple_
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from service.auth.principal import Principal
from service.db.models import IdempotencyKey
from service.problems import InvalidRequest

TTL = timedelta(hours=24)
SWEEP = 100
"""Expired keys of its tenant one keyed batch deletes (keys expire as fast as they are made, so
this keeps up with any tenant that uses them)."""
KEY_PATTERN = re.compile(r"[\x21-\x7e]{1,200}")
"""1-200 visible ASCII characters (RFC 9110 token-ish; no spaces, nothing a log would mangle)."""


@dataclass(frozen=True)
class Key:
    tenant_id: uuid.UUID
    principal_id: uuid.UUID
    client_id: str
    key: str
    request_hash: bytes

    @property
    def lock_name(self) -> str:
        # "idem|" never begins a memory key lock's name (those begin with a tenant uuid).
        return f"idem|{self.tenant_id}|{self.principal_id}|{self.client_id}|{self.key}"


@dataclass(frozen=True)
class Stored:
    request_hash: bytes
    status: int
    answer: bytes | None
    memory_ids: tuple[uuid.UUID, ...]


def key_of(principal: Principal, raw: str, request: bytes) -> Key:
    """The caller's key for `request` (its canonical bytes); a malformed key is 422."""
    if not KEY_PATTERN.fullmatch(raw):
        raise InvalidRequest(
            "The Idempotency-Key header must be 1 to 200 visible ASCII characters (no spaces); "
            "a UUID is a good key. Nothing was written.",
            errors=[
                {
                    "field": "Idempotency-Key",
                    "source": "header",
                    "message": "Expected 1-200 visible ASCII characters",
                }
            ],
        )
    return Key(
        principal.tenant_id,
        principal.principal_id,
        principal.client_id,
        raw,
        hashlib.sha256(request).digest(),
    )


def _this(key: Key) -> ColumnElement[bool]:
    return and_(
        IdempotencyKey.tenant_id == key.tenant_id,
        IdempotencyKey.principal_id == key.principal_id,
        IdempotencyKey.client_id == key.client_id,
        IdempotencyKey.key == key.key,
    )


async def stored(session: AsyncSession, key: Key) -> Stored | None:
    """The unexpired answer under `key`, if any."""
    row = (
        await session.execute(
            select(
                IdempotencyKey.request_hash,
                IdempotencyKey.status,
                IdempotencyKey.answer,
                IdempotencyKey.memory_ids,
            )
            .where(_this(key))
            .where(IdempotencyKey.expires_at > func.now())
        )
    ).one_or_none()
    if row is None:
        return None
    return Stored(bytes(row[0]), int(row[1]), row[2], tuple(row[3]))


async def try_lock(session: AsyncSession, key: Key) -> bool:
    """Take the key's lock until the transaction ends; False: another call holds it."""
    taken = await session.scalar(
        select(func.pg_try_advisory_xact_lock(func.hashtextextended(key.lock_name, 0)))
    )
    return bool(taken)


async def keep(
    session: AsyncSession, key: Key, status: int, answer: bytes, memory_ids: list[uuid.UUID]
) -> None:
    """Store the answer in the call's transaction (an expired row of the key is replaced), and
    delete some expired keys of the tenant."""
    names = (IdempotencyKey.principal_id, IdempotencyKey.client_id, IdempotencyKey.key)
    expired = (
        select(*names)
        .where(IdempotencyKey.tenant_id == key.tenant_id, IdempotencyKey.expires_at <= func.now())
        .limit(SWEEP)
    )
    await session.execute(
        delete(IdempotencyKey).where(
            IdempotencyKey.tenant_id == key.tenant_id,
            IdempotencyKey.expires_at <= func.now(),
            tuple_(*names).in_(expired),
        )
    )
    values = {
        "tenant_id": key.tenant_id,
        "principal_id": key.principal_id,
        "client_id": key.client_id,
        "key": key.key,
        "request_hash": key.request_hash,
        "status": status,
        "answer": answer,
        "memory_ids": sorted(set(memory_ids)),
        "expires_at": func.now() + TTL,
    }
    statement = insert(IdempotencyKey).values(**values)
    await session.execute(
        statement.on_conflict_do_update(
            constraint="pk_idempotency_keys",
            set_={name: statement.excluded[name] for name in values if name != "key"}
            | {"created_at": func.now()},
        )
    )
