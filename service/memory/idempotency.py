"""Idempotency keys: a retried write, revert, delete or batch (any operation declared
`idempotent`, service/operations.py) is carried out once.

The adapters do it for every such operation, the operation's own code knows nothing of it:
REST's route hooks (service/http/idempotency.py) and the MCP tool runner (service/mcp/server.py)
`claim` the key before the operation runs (a stored answer is replayed instead) and `settle` it
with the answer after. The request a key stands for is the operation, its route or tool, its
target and its canonical input (`request_identity`): the same key with anything else is 422.

A key is scoped to (tenant, principal, client). The stored answer is written in the call's own
transaction, so it exists exactly when the call committed; a call that failed, was refused or
whose process died leaves nothing, and the key can be used again. While a call with the key runs
it holds a transaction-level advisory lock named after the key: a second call with it answers
409 `idempotency-key-in-flight` instead of waiting or writing. Keys live `TTL`; an expired one is
as good as unused, and the next keyed call of the tenant deletes up to `SWEEP` of them.

A stored answer may hold memory values (every `MemoryOut` in it), so it is replayed only while
the caller could get them now: every memory it holds still readable by the caller through
Visible (live or an earlier version, not expired, revoked, retracted or deleted), in a space
the caller may still write (`still_theirs`). An answer holding no memory (a delete's 204) is
replayed as it was. Otherwise the key answers 410, as when a trigger
dropped the body (a memory deleted, retracted, revoked or expired in place).
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import msgspec
from sqlalchemy import ColumnElement, and_, delete, func, select, tuple_
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from service.auth.principal import Principal
from service.calls import Facts
from service.db.models import IdempotencyKey
from service.memory import repository
from service.memory.schemas import MemoryOut
from service.policy.visible import Action, visible, write_targets
from service.problems import (
    IdempotencyAnswerGone,
    IdempotencyKeyInFlight,
    IdempotencyKeyReused,
    InvalidRequest,
)
from service.shredding import KeyDestroyed, vault_of
from service.shredding.vault import SEALED_ANSWER

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
    sealed: bool = False
    """The tenant's `crypto_shredding`: the answer (memory text) is stored sealed under the
    caller's data key, so no copy of the database holds its text once the key is destroyed."""

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
        principal.tenant_settings.crypto_shredding,
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
        "answer": await _sealed(session, key, answer),
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


def request_identity(operation: str, route: str, target: str, payload: bytes) -> bytes:
    """What a key stands for: the operation, the route or tool that carried it, its target (a
    path, a precondition) and its input as canonical JSON (keys sorted, so a retry that
    re-serializes its body is the same request). Anything else under the key is 422."""
    try:
        canonical = msgspec.json.encode(msgspec.json.decode(payload), order="sorted")
    except msgspec.DecodeError:  # no JSON body (a delete): the bytes as they came
        canonical = payload
    return b"\n".join([operation.encode(), route.encode(), target.encode(), canonical])


@dataclass(frozen=True)
class Replay:
    """A stored answer, to be sent again."""

    status: int
    body: bytes
    """The answer's JSON as first sent (empty for an answer without a body)."""


async def claim(
    session: AsyncSession, principal: Principal, facts: Facts, key: Key
) -> Replay | None:
    """Before the operation runs: the stored answer under `key` if there is one (422 if it
    answered another request, 410 if it can no longer be given); otherwise hold the key for
    this call's transaction (409 while another call holds it) and run."""
    earlier = await _replay(session, principal, facts, key)
    if earlier is not None:
        return earlier
    if not await try_lock(session, key):
        raise _in_flight()
    return await _replay(session, principal, facts, key)


async def settle(session: AsyncSession, key: Key, status: int, content: object) -> bytes:
    """After the operation answered `content` with `status` (in its transaction, before the
    commit): keep the answer under `key`; its JSON bytes are returned. The key is taken again
    first: a remote embedding provider is called outside the transaction, which let the claim
    go, and another call with the key may have answered meanwhile (this one then rolls back)."""
    if not await try_lock(session, key) or await stored(session, key) is not None:
        raise _in_flight()
    body = b"" if content is None else msgspec.json.encode(content)
    await keep(session, key, status, body, list(held_memories(content)))
    return body


def held_memories(content: object) -> Iterator[uuid.UUID]:
    """The ids of every memory whose value an answer holds (each `MemoryOut` in it, however
    deep): the ones a replay re-checks, and whose deletion drops the stored answer."""
    stack: list[Any] = [content]
    while stack:
        value = stack.pop()
        if isinstance(value, MemoryOut):
            yield value.id
        elif isinstance(value, msgspec.Struct):
            stack.extend(getattr(value, name) for name in value.__struct_fields__)
        elif isinstance(value, list | tuple):
            stack.extend(value)
        elif isinstance(value, dict):
            stack.extend(value.values())


def _in_flight() -> IdempotencyKeyInFlight:
    return IdempotencyKeyInFlight(
        "A request with this Idempotency-Key is still being carried out; retry after "
        "Retry-After seconds to get its answer. Nothing was written."
    )


async def _replay(
    session: AsyncSession, principal: Principal, facts: Facts, key: Key
) -> Replay | None:
    earlier = await stored(session, key)
    if earlier is None:
        return None
    if earlier.request_hash != key.request_hash:
        raise IdempotencyKeyReused(
            "This Idempotency-Key answered another request (another body, route or operation) "
            "within the last 24 hours. Nothing was written: send this request under a new key."
        )
    if earlier.answer is None or not await still_theirs(session, principal, earlier.memory_ids):
        # One answer for every reason (deleted, expired, revoked, a grant taken away): the
        # 410 tells the caller nothing about memories it may no longer see.
        raise IdempotencyAnswerGone(
            "The request with this Idempotency-Key was carried out, but its answer can no "
            "longer be given: a memory it named has since been deleted, retracted, revoked, "
            "expired or erased, or is no longer yours to read or write. Nothing was "
            "written; read the memories (GET /v1/memories) before writing under a new key."
        )
    answer = await _opened(session, key, bytes(earlier.answer))
    if answer is None:
        raise IdempotencyAnswerGone(
            "The request with this Idempotency-Key was carried out, but its answer can no "
            "longer be given: it was erased. Nothing was written; read the memories (GET "
            "/v1/memories) before writing under a new key."
        )
    held = len(earlier.memory_ids)
    facts.add_targets(earlier.memory_ids)
    if held:
        facts.count(held)
    facts.reason = "idempotent-replay" + (f":items={held}" if held else "")
    return Replay(earlier.status, answer)


async def _sealed(session: AsyncSession, key: Key, answer: bytes) -> bytes:
    if not key.sealed or not answer:
        return answer
    return await vault_of(session).seal_answer(
        key.tenant_id, key.principal_id, key.lock_name, answer
    )


async def _opened(session: AsyncSession, key: Key, stored_answer: bytes) -> bytes | None:
    """A stored answer as first sent; None when it was sealed and its key is destroyed. A
    sealed answer opens whatever the tenant's setting is now (it may have been turned off)."""
    if not stored_answer.startswith(SEALED_ANSWER):
        return stored_answer
    try:
        return await vault_of(session).open_answer(
            key.tenant_id, key.principal_id, key.lock_name, stored_answer
        )
    except KeyDestroyed:
        return None


async def still_theirs(
    session: AsyncSession, principal: Principal, memory_ids: Sequence[uuid.UUID]
) -> bool:
    """May the caller get a stored answer's memories now, as a fresh write would give them:
    each still readable through Visible (any version; not expired, revoked, retracted or
    gone; audience included), in a space the caller may still write. Asked at every replay,
    so a grant revoked, a team left or a delegation narrowed since the call answers 410
    instead of handing back the values."""
    if not memory_ids:
        return True
    wanted = list(dict.fromkeys(memory_ids))
    found = await repository.readable_sources(session, visible(principal, Action.READ), wanted)
    if len(found) != len(wanted):
        return False
    writable = set((await write_targets(session, principal)).writable)
    return all(space_id in writable for _, space_id, _ in found)
