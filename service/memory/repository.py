"""SQL for memories. Every statement starts from a `Visible` (service.policy.visible)."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import cache
from typing import Any, Protocol
from typing import cast as cast_type

from pgvector.sqlalchemy import Vector
from sqlalchemy import (
    CTE,
    BigInteger,
    ColumnElement,
    Date,
    DateTime,
    Float,
    FromClause,
    Insert,
    Integer,
    LargeBinary,
    Row,
    ScalarSelect,
    Select,
    Table,
    Text,
    and_,
    any_,
    bindparam,
    case,
    cast,
    column,
    func,
    literal,
    null,
    or_,
    select,
    union_all,
    values,
)
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, REGCONFIG, TSQUERY, UUID, distinct_on
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.sql.elements import NamedColumn

from service.db.driver import QUERY_CANCELED, built_once, run
from service.db.models import EMBEDDING_DIMENSIONS, Memory, MemoryRecall, Space
from service.memory.reserved import RESERVED_KEYS, SUMMARY_KIND
from service.policy.visible import (
    Action,
    Liveness,
    PerShape,
    Visible,
    bound_values,
    live_rows_up_to,
    shape_of,
    template_caller,
    visible,
)
from service.shredding import vault_of
from service.shredding.vault import SealedRow

_UUIDS = ARRAY(UUID)
_EVERY_UNREVOKED = Liveness.any_version().with_expired().with_retracted()
"""The write path's bookkeeping: a key's chain continues through closed, expired and retracted
versions, so a number is never issued twice."""
_HISTORY = Liveness.any_version().with_retracted()
"""What a history walk shows: every version, a retracted stub as a stub (expired and revoked
versions are hops the caller cannot see: the walk stops there)."""


@dataclass(frozen=True)
class MemoryFilters:
    subject: str | None = None
    kind: str | None = None
    key: str | None = None
    space_id: uuid.UUID | None = None
    embedding_model: str | None = None
    """The query vector's model (`model_tag`): a vector leg ranks only rows embedded by it, so
    no cosine compares vectors of two models (embeddings.reembed leaves rows of the old one
    until it has re-embedded them; the lexical leg still finds those). None: any row (tools
    and benchmarks with a single model)."""

    def conditions(self) -> list[Any]:
        """The filters set, each value a named parameter (`values`)."""
        columns = (Memory.subject, Memory.kind, Memory.key, Memory.space_id)
        return [
            column == bindparam(f"filter_{column.key}", value, type_=column.type)
            for column, value in zip(columns, self._values(), strict=True)
            if value is not None
        ]

    def vector_conditions(self) -> list[Any]:
        """`conditions()` for a vector leg: rows of the query's model only."""
        if self.embedding_model is None:
            return self.conditions()
        return [*self.conditions(), Memory.embedding_model == self._model()]

    def cosine_distance(self, query_vector: list[float]) -> ColumnElement[Any]:
        """A row's cosine distance to the query, NULL for a row of another model (a lexical
        hit of such a row shows no cosine rather than one between two models' vectors)."""
        distance: ColumnElement[Any] = Memory.embedding.cosine_distance(query_param(query_vector))
        if self.embedding_model is None:
            return distance
        return case((Memory.embedding_model == self._model(), distance), else_=null())

    def _values(self) -> tuple[str | uuid.UUID | None, ...]:
        return (self.subject, self.kind, self.key, self.space_id)

    def _model(self) -> ColumnElement[str]:
        return bindparam("filter_embedding_model", self.embedding_model, type_=Text)

    def shape(self) -> tuple[bool, ...]:
        """Which filters are set: statements built once per shape (`values` binds them)."""
        return (*(v is not None for v in self._values()), self.embedding_model is not None)

    def values(self) -> dict[str, Any]:
        names = ("filter_subject", "filter_kind", "filter_key", "filter_space_id")
        bound: dict[str, Any] = dict(zip(names, self._values(), strict=True))
        bound["filter_embedding_model"] = self.embedding_model
        return bound

    def template(self) -> MemoryFilters:
        """Placeholder values of this shape (a statement built from them is run with `values`)."""
        placeholder = "placeholder"

        def kept(value: str | None) -> str | None:
            return None if value is None else placeholder

        return MemoryFilters(
            subject=kept(self.subject),
            kind=kept(self.kind),
            key=kept(self.key),
            space_id=None if self.space_id is None else uuid.UUID(int=0),
            embedding_model=kept(self.embedding_model),
        )


def query_param(query_vector: list[float]) -> ColumnElement[Any]:
    """The query vector as the statement's named parameter `query_vector`."""
    return bindparam("query_vector", query_vector, type_=Memory.embedding.type)


SEALING = (Memory.tenant_id, Memory.owner_id, Memory.value_key, Memory.value_sealed)
"""The columns opening a sealed row's text takes (service/shredding)."""

GROUPABLE = {"kind": Memory.kind, "space": Memory.space_id, "subject": Memory.subject}

ANSWER = (
    Memory.id,
    Memory.space_id,
    Memory.subject,
    Memory.kind,
    Memory.key,
    Memory.value,
    Memory.valid_from,
    Memory.valid_until,
    Memory.expires_at,
    Memory.superseded_at,
    Memory.supersedes,
    Memory.superseded_by,
    Memory.metadata_,
    Memory.version,
    Memory.writer_id,
    Memory.client_id,
    Memory.act,
    Memory.source,
    Memory.recorded_at,
    Memory.derived_from,
    Memory.read_requires,
    Memory.embedding_model,
    Memory.retracted_at,
    Memory.review_state,
    Memory.confidence,
    *SEALING,  # what opening a sealed row's text takes; never shown
)
"""The columns a search hit shows (service.memory.service.to_out): not the vector, the
lexemes or the content hash, which are the widest and which the answer never carries."""


class MemoryRow(SealedRow, Protocol):
    """What an answer is built from: a `Memory` entity, or a Core row of `ANSWER` (with what
    opening a sealed row's text takes, `SEALING`)."""

    @property
    def space_id(self) -> uuid.UUID: ...
    @property
    def subject(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def key(self) -> str: ...
    @property
    def value(self) -> str: ...
    @property
    def valid_from(self) -> datetime: ...
    @property
    def valid_until(self) -> datetime | None: ...
    @property
    def expires_at(self) -> datetime | None: ...
    @property
    def superseded_at(self) -> datetime | None: ...
    @property
    def supersedes(self) -> uuid.UUID | None: ...
    @property
    def superseded_by(self) -> uuid.UUID | None: ...
    @property
    def metadata_(self) -> dict[str, Any]: ...
    @property
    def version(self) -> int: ...
    @property
    def writer_id(self) -> uuid.UUID: ...
    @property
    def client_id(self) -> str: ...
    @property
    def act(self) -> dict[str, Any] | None: ...
    @property
    def source(self) -> str | None: ...
    @property
    def recorded_at(self) -> datetime: ...
    @property
    def derived_from(self) -> list[uuid.UUID]: ...
    @property
    def read_requires(self) -> list[uuid.UUID]: ...
    @property
    def embedding_model(self) -> str: ...
    @property
    def retracted_at(self) -> datetime | None: ...
    @property
    def review_state(self) -> str | None: ...
    @property
    def confidence(self) -> float | None: ...


Hit = tuple[MemoryRow, float]
"""A search hit: the row and its score (cosine similarity)."""


@dataclass(frozen=True)
class FusedHit:
    """A hit of a hybrid or lexical search: the row, its cosine, the share of the query's term
    weight it matches (None: it matches no term), and its reciprocal-rank-fusion value."""

    row: MemoryRow
    score: float | None
    """None: the row was embedded by another model than the query (a re-embedding is under
    way) and was found by its words."""
    lexical_score: float | None
    fused_score: float


def cast_row(row: Row[Any]) -> MemoryRow:
    # A Core row of ANSWER has every attribute of MemoryRow by name (mypy cannot see it).
    return cast_type(MemoryRow, row)


@dataclass(frozen=True)
class KeyRef:
    """One memory key: at most one live version per (space, subject, kind, key, audience). The
    audience (`read_requires`, sorted) is part of the key: rows with different audiences never
    supersede each other, so a writer cannot close, or run into, a version it may not read."""

    tenant_id: uuid.UUID
    space_id: uuid.UUID
    subject: str
    kind: str
    key: str
    read_requires: tuple[uuid.UUID, ...] = ()

    @classmethod
    def of(cls, row: Any) -> KeyRef:
        """The key of a stored version (anything with the memory's key columns)."""
        return cls(
            row.tenant_id, row.space_id, row.subject, row.kind, row.key,
            tuple(sorted(row.read_requires)),
        )  # fmt: skip

    def conditions(self) -> list[ColumnElement[bool]]:
        return [*self.subject_conditions(), Memory.key == self.key]

    def subject_conditions(self) -> list[ColumnElement[bool]]:
        """Every key of this subject and kind in this space with this audience: the keys a
        write here could supersede by naming them."""
        return [
            Memory.space_id == self.space_id,
            Memory.subject == self.subject,
            Memory.kind == self.kind,
            Memory.read_requires == cast(literal(list(self.read_requires), _UUIDS), _UUIDS),
        ]


@dataclass(frozen=True)
class Version:
    id: uuid.UUID
    version: int


async def lock_key(session: AsyncSession, ref: KeyRef, *, subject_too: bool = False) -> datetime:
    """`lock_keys` of one key (with its subject's lock first when `subject_too`)."""
    return await lock_keys(session, [ref], gated=[ref] if subject_too else [])


async def lock_keys(
    session: AsyncSession,
    refs: Sequence[KeyRef],
    *,
    gated: Sequence[KeyRef] = (),
    shared: Sequence[str] = (),
) -> datetime:
    """Serialize writers and deleters of each key until commit, so versions form one linear
    chain instead of colliding on the live-key unique index; then return the wall clock *after*
    the locks. Stamping with that (not the transaction start) keeps a later version's times
    after its predecessor's even when the two transactions began in the other order. One
    statement: its select list is evaluated left to right, so the clock is read once every
    lock is held.

    `gated` (the write gate) first takes the lock of each key's whole (space, subject, kind):
    two writers of *different* new keys for one subject would otherwise hold different key
    locks, both find no other key and both pass the gate. Under it the second one's gate
    statement (a new snapshot) sees the first one's committed key.

    No cycle can form: every writer takes its subject locks before its key locks, each group
    in the sorted order of the lock names (a batch of many keys too: two batches naming the
    same keys in opposite orders take them in the same order, so one waits for the other),
    and deleters take one key lock only.

    `shared`: locks taken in shared mode before all others (a writer's revocation lock,
    service/revocation/repository.py: writers share it, a revoke holds it alone)."""
    subjects = sorted({_subject_lock(ref) for ref in gated})
    keys = sorted({_key_lock(ref) for ref in refs})
    (row,) = await run(
        session,
        _locks(),
        {"lock_names": [*subjects, *keys], "shared_lock_names": sorted(set(shared))},
    )
    now = row[-1]
    assert isinstance(now, datetime)
    return now


@cache
def _locks() -> Select[Any]:
    """`lock_keys`'s statement, built once: its shape is the same for any number of names."""
    name = func.unnest(bindparam("lock_names", [], type_=ARRAY(Text)))
    named = name.column_valued("name")
    # unnest yields the names in array order, and the aggregate takes each lock as it goes.
    locks = select(func.count(_advisory(named))).scalar_subquery()
    first = func.unnest(bindparam("shared_lock_names", [], type_=ARRAY(Text)))
    sharing = func.pg_advisory_xact_lock_shared(
        func.hashtextextended(first.column_valued("name"), 0)
    )
    shared_locks = select(func.count(sharing)).scalar_subquery()
    return built_once(select(shared_locks, locks, func.clock_timestamp()))


def _key_lock(ref: KeyRef) -> str:
    return f"{ref.tenant_id}|{ref.space_id}|{ref.subject}|{ref.kind}|{ref.key}"


def _subject_lock(ref: KeyRef) -> str:
    # "|*" cannot end a key (KEY_PATTERN), so this name never equals a key lock's.
    return f"{ref.tenant_id}|{ref.space_id}|{ref.subject}|{ref.kind}|*"


def _advisory(name: str | ColumnElement[str]) -> ColumnElement[Any]:
    return func.pg_advisory_xact_lock(func.hashtextextended(name, 0))


def _unnest(name: str, **columns: Any) -> Select[Any]:
    """`SELECT * FROM unnest(:a, :b, ...) AS name(a, b, ...)` of columns of the given types:
    rows given as one array parameter per column (`_unnested` names them), so the statement's
    text, its compiled form and the statement object itself are the same whatever the number
    of rows (a VALUES list is compiled anew per length and binds a parameter per value). Built
    with empty arrays: a statement built once per shape takes its rows as parameters."""
    arrays = [bindparam(f"{name}_{column}", [], ARRAY(type_)) for column, type_ in columns.items()]
    rows = func.unnest(*arrays).table_valued(*columns).render_derived(name=name)
    return select(*(rows.c[column] for column in columns))


def _unnested(name: str, **columns: Sequence[Any]) -> dict[str, list[Any]]:
    """The parameters of `_unnest(name, ...)`: one list per column, the rows in order."""
    return {f"{name}_{column}": list(values) for column, values in columns.items()}


def _pg_array(items: Sequence[object]) -> str:
    """PostgreSQL's text form of an array (`{"a","b"}`): a VALUES list carries arrays as text,
    cast once (an empty list bound as a parameter has no element type to infer)."""
    quoted = ('"' + str(item).replace("\\", "\\\\").replace('"', '\\"') + '"' for item in items)
    return "{" + ",".join(quoted) + "}"


@dataclass(frozen=True)
class LiveKey:
    """A live memory of the subject, as the write gate offers it."""

    key: str
    id: uuid.UUID
    value_start: str
    """The start of its value (the service cuts it to its first words)."""


@dataclass(frozen=True)
class SubjectKeys:
    key_is_live: bool
    """The written key has a live version the writer can read: the write supersedes it."""
    others: list[LiveKey]
    """Live keys of the same subject, kind, space and audience besides the written one, in key
    order, at most the limit asked for."""
    more: bool = False
    """More such keys exist than `others` holds."""


@dataclass(frozen=True)
class GateQuestion:
    """One (space, subject, kind, audience) the write gate asks about (`ref.key` is not used),
    and the keys written to it."""

    ref: KeyRef
    keys: tuple[str, ...]


async def live_keys_of_subjects(
    session: AsyncSession, scope: Visible, asked: Sequence[GateQuestion], *, limit: int
) -> list[list[LiveKey]]:
    """What the write gate decides on, in one statement under the writer's read predicate (the
    caller holds the subject locks): for each question, the live versions of its (space,
    subject, kind, audience) with one of its keys, then the first `limit + 1` others by key
    (enough to list `limit` of them besides any one written key, and to say there are more).
    Only rows the writer can read count, and only in the chain family the write could
    supersede by reusing a key (same space and audience): rows elsewhere would not be closed
    by that key, so offering them would leave the stale value live."""
    if not asked:
        return []
    statement, params = _LIVE_KEYS(scope)
    params |= _unnested(
        "asked",
        question=list(range(len(asked))),
        space_id=[one.ref.space_id for one in asked],
        subject=[one.ref.subject for one in asked],
        kind=[one.ref.kind for one in asked],
        read_requires=[_pg_array(one.ref.read_requires) for one in asked],
        keys=[_pg_array(one.keys) for one in asked],
        rows=[limit + 1 + len(one.keys) for one in asked],
    )
    rows = await run(session, statement, params)
    plain = await vault_of(session).plaintexts(rows)
    found: list[list[LiveKey]] = [[] for _ in asked]
    for row in rows:
        start = plain[row.id][:400] if row.id in plain else row.start
        found[row.question].append(LiveKey(row.key, row.id, start))
    return found


def _build_live_keys(scope: Visible) -> Select[Any]:
    questions = _unnest(
        "asked",
        question=Integer,
        space_id=UUID,
        subject=Text,
        kind=Text,
        read_requires=Text,
        keys=Text,
        rows=Integer,
    ).subquery("questions")
    written_key = Memory.key == any_(cast(questions.c["keys"], ARRAY(Text)))
    live = (
        scope.select(Memory.key, Memory.id, func.left(Memory.value, 400).label("start"), *SEALING)
        .where(
            Memory.space_id == questions.c.space_id,
            Memory.subject == questions.c.subject,
            Memory.kind == questions.c.kind,
            Memory.read_requires == cast(questions.c.read_requires, _UUIDS),
            # Proposals are nobody's keys yet (service/memory/review.py).
            Memory.review_state.is_(None),
        )
        .order_by(written_key.desc(), Memory.key)
        .limit(questions.c.rows)
        .lateral("live")
    )
    return (
        select(
            questions.c.question,
            live.c.key,
            live.c.id,
            live.c.start,
            *(live.c[one.key] for one in SEALING),
        )
        .select_from(questions)
        .join(live, literal(True))
        .order_by(questions.c.question)
    )


_LIVE_KEYS = PerShape(_build_live_keys)


@dataclass(frozen=True)
class Supersession:
    previous: Version | None
    """The newest version of the key before this write, closed or expired included: the new
    one continues it (`supersedes`, version + 1)."""
    superseded: list[uuid.UUID]
    """The live versions this write closed."""


@dataclass(frozen=True)
class NewVersion:
    """A version about to be written: its key, its id, and when its valid time begins."""

    ref: KeyRef
    new_id: uuid.UUID
    valid_from: datetime


async def supersede(
    session: AsyncSession,
    scope: Visible,
    ref: KeyRef,
    *,
    new_id: uuid.UUID,
    at: datetime,
    valid_from: datetime,
) -> Supersession:
    """`supersede_many` of one key."""
    [made] = await supersede_many(session, scope, [NewVersion(ref, new_id, valid_from)], at=at)
    return made


async def supersede_many(
    session: AsyncSession, scope: Visible, writes: Sequence[NewVersion], *, at: datetime
) -> list[Supersession]:
    """Make room for a new version of each key (distinct keys; the caller holds their locks),
    in one statement whatever their number:

    - read each key's newest version, closed or expired included: the new one continues it;
    - close the live version(s) of each key in its space only: supersession is by key and
      scope, never by similarity, and never reaches into another space. Expired versions are
      closed too, so the key has exactly one unclosed row. Valid time ends where the new
      version's begins (never before the old one's own start);
    - if a newest version was already closed (the head of the key was deleted), point it at
      the new one so the chain stays walkable (its times stay as they were).

    All three parts read the same snapshot, taken before any of them writes, so each newest
    version is the one before this write, and the close and the relink touch disjoint rows
    (the close takes unclosed rows, the relink a closed one): no row is written twice. The
    answer is in the order of `writes`."""
    if not writes:
        return []
    statement, params = _SUPERSEDE(scope)
    params |= _unnested(
        "given",
        new_id=[one.new_id for one in writes],
        space_id=[one.ref.space_id for one in writes],
        subject=[one.ref.subject for one in writes],
        kind=[one.ref.kind for one in writes],
        key=[one.ref.key for one in writes],
        read_requires=[_pg_array(one.ref.read_requires) for one in writes],
        valid_from=[one.valid_from for one in writes],
    )
    params |= {"given_keys": sorted({one.ref.key for one in writes}), "supersede_now": at}
    made: dict[uuid.UUID, Supersession] = {}
    for new_id, previous_id, previous_version, superseded, _ in await run(
        session, statement, params
    ):
        previous = None if previous_id is None else Version(previous_id, previous_version)
        made[new_id] = Supersession(previous, list(superseded or []))
    return [made[one.new_id] for one in writes]


def _build_supersede(scope: Visible) -> Select[Any]:
    given = _unnest(
        "given",
        new_id=UUID,
        space_id=UUID,
        subject=Text,
        kind=Text,
        key=Text,
        read_requires=Text,
        valid_from=DateTime(timezone=True),
    ).cte("given")
    # The keys once more as one array: a condition the planner can take into the live-key
    # index (uq_memories_live_key) for the close, instead of joining every live row of the
    # space to `given`.
    keys = bindparam("given_keys", [], ARRAY(Text))
    at = bindparam("supersede_now", None, DateTime(timezone=True))
    same_key = and_(
        Memory.key == any_(keys),
        Memory.space_id == given.c.space_id,
        Memory.subject == given.c.subject,
        Memory.kind == given.c.kind,
        Memory.key == given.c.key,
        Memory.read_requires == cast(given.c.read_requires, _UUIDS),
        # Proposals and tombstones are no versions of the key (service/memory/review.py).
        Memory.review_state.is_(None),
    )
    newest = (
        scope.select(
            Memory.id,
            Memory.version,
            Memory.superseded_at,
            given.c.new_id.label("for_id"),
            liveness=_EVERY_UNREVOKED,
        )
        .join_from(Memory, given, same_key)
        .ext(distinct_on(given.c.new_id))
        .order_by(given.c.new_id, Memory.version.desc())
        .cte("newest")
    )
    closed = (
        scope.update(liveness=Liveness.live().with_expired())
        .where(same_key)
        .values(
            superseded_at=at,
            valid_until=func.greatest(Memory.valid_from, given.c.valid_from),
            superseded_by=given.c.new_id,
        )
        .returning(Memory.id, given.c.new_id.label("for_id"))
        .cte("closed")
    )
    relinked = (
        scope.update(liveness=_EVERY_UNREVOKED)
        .where(
            Memory.id == newest.c.id,
            newest.c.superseded_at.is_not(None),
            Memory.superseded_by.is_(None),
        )
        .values(superseded_by=newest.c.for_id)
        .returning(Memory.id)
        .cte("relinked")
    )
    closed_for = (
        select(closed.c.for_id, func.array_agg(closed.c.id).label("ids"))
        .group_by(closed.c.for_id)
        .subquery("closed_for")
    )
    return (
        select(
            given.c.new_id,
            newest.c.id,
            newest.c.version,
            closed_for.c.ids,
            # Referenced so the statement reads its RETURNING; it runs to completion regardless.
            select(func.count()).select_from(relinked).scalar_subquery(),
        )
        .select_from(given)
        .outerjoin(newest, newest.c.for_id == given.c.new_id)
        .outerjoin(closed_for, closed_for.c.for_id == given.c.new_id)
    )


_SUPERSEDE = PerShape(_build_supersede)


async def insert(session: AsyncSession, scope: Visible, row: Memory, *, sealing: bool) -> Memory:
    """`insert_many` of one row."""
    await insert_many(session, scope, [row], sealing=sealing)
    return row


async def insert_many(
    session: AsyncSession, scope: Visible, rows: Sequence[Memory], *, sealing: bool
) -> None:
    """Insert `rows` into `scope`'s tenant in one statement of one parameter per column,
    whatever their number: `INSERT ... SELECT` from `unnest` of one text array per column,
    each cast to its column's type. (A multi-row VALUES of 500 rows binds ~15,000
    parameters, and the driver's rewriting of that query text cost more than the database's
    insert; COPY FROM is refused on a table with row-level security.) Row-level security's
    `WITH CHECK` and the storage trigger see every row, as for any INSERT. The service sets
    every column the answer shows, so nothing is read back.

    `sealing` (the tenant's `crypto_shredding`): each row's text is stored sealed under its
    owner's data key (service/shredding), `value` "", and its lexemes are made from the
    plaintext by the statement (`to_tsvector` of a parameter: the text is in no column). The
    entities keep their plaintext `value`, for the answer; they are never flushed."""
    if not rows:
        return
    (statement, columns), params = _INSERT(scope)
    overrides: list[dict[str, Any]] = [{} for _ in rows]
    if sealing:
        vault = vault_of(session)
        for row, override in zip(rows, overrides, strict=True):
            # A consolidation summary (a reserved key only the job writes) gets a key of its
            # own: it is erased, and its key destroyed, with any person it quotes.
            own = row.kind == SUMMARY_KIND and row.key in RESERVED_KEYS
            sealed = await vault.seal(scope.tenant_id, row.owner_id, row.id, row.value, own_key=own)
            override.update(
                value="", value_sealed=sealed.blob, value_key=sealed.key_id, lexical=row.value
            )
    for key, inserted in columns:
        params[f"rows_{inserted.name}"] = [
            _as_text(override[key], inserted.type)
            if key in override
            else (None if key == "lexical" else _as_text(getattr(row, key), inserted.type))
            for row, override in zip(rows, overrides, strict=True)
        ]
    await run(session, statement, params)


def _build_insert(scope: Visible) -> tuple[Insert, list[tuple[str, NamedColumn[Any]]]]:
    """`insert_many`'s statement, and the (attribute, column) pairs whose arrays it takes:
    every column the service sets on a new row. `lexical`'s array holds a sealed row's
    plaintext (NULL for any other, whose lexemes the trigger `memories_lexical` makes)."""
    columns = [
        (attribute.key, attribute.columns[0])
        for attribute in sa_inspect(Memory).column_attrs
        if attribute.key != "tenant_id"
    ]
    names = [inserted.name for _, inserted in columns]
    arrays = [bindparam(f"rows_{name}", [], ARRAY(Text)) for name in names]
    given = func.unnest(*arrays).table_valued(*names).render_derived(name="given")

    def value_of(column: NamedColumn[Any]) -> ColumnElement[Any]:
        if column.name == "lexical":
            return func.to_tsvector(cast(given.c.lexical_config, REGCONFIG), given.c.lexical)
        return cast(given.c[column.name], column.type)

    # The table, not the mapped class: the ORM's bulk-insert machinery has nothing to do here
    # (no object is read back) and costs more CPU than the statement's execution.
    statement = pg_insert(cast_type(Table, Memory.__table__)).from_select(
        ["tenant_id", *names],
        select(scope.tenant, *(value_of(one) for _, one in columns)),
    )
    return statement, columns


_INSERT = PerShape(_build_insert)


def _as_text(value: Any, type_: Any) -> str | None:
    """A column value in PostgreSQL's text input form (`insert_many` casts it back)."""
    if isinstance(type_, JSONB):
        return json.dumps(value)  # None too: the ORM stores JSON null for it
    if value is None or isinstance(value, str):
        return value
    if isinstance(type_, Vector):
        return _vector_text(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes):
        return "\\x" + value.hex()
    if isinstance(value, list):
        return _pg_array(value)
    return str(value)  # uuid, int


async def readable_sources(
    session: AsyncSession, scope: Visible, ids: list[uuid.UUID], *, revoked: bool = False
) -> list[tuple[uuid.UUID, uuid.UUID, list[uuid.UUID]]]:
    """(id, space, read_requires) of the given memories the caller may read (any version;
    hidden ones too if `revoked`: a write citing one is stored hidden, never refused as if
    the id did not exist)."""
    liveness = Liveness.including_revoked() if revoked else Liveness.any_version()
    rows = await session.execute(
        scope.select(Memory.id, Memory.space_id, Memory.read_requires, liveness=liveness).where(
            Memory.id.in_(ids)
        )
    )
    return [(row[0], row[1], list(row[2])) for row in rows.all()]


async def get(
    session: AsyncSession, scope: Visible, memory_id: uuid.UUID, *, retracted: bool = False
) -> Memory | None:
    """Any version by id; a retracted stub only when asked (revert tells a stub from nothing)."""
    liveness = Liveness.any_version()
    found: Memory | None = await session.scalar(
        scope.select(Memory, liveness=liveness.with_retracted() if retracted else liveness).where(
            Memory.id == memory_id
        )
    )
    return found


async def list_page(
    session: AsyncSession,
    scope: Visible,
    filters: MemoryFilters,
    *,
    after: uuid.UUID | None,
    limit: int,
) -> Sequence[Memory]:
    statement = scope.select(Memory).where(*filters.conditions())
    if after is not None:
        statement = statement.where(Memory.id < after)
    rows = await session.scalars(statement.order_by(Memory.id.desc()).limit(limit))
    return rows.all()


async def count(
    session: AsyncSession,
    scope: Visible,
    filters: MemoryFilters,
    *,
    group_by: str | None,
    max_groups: int,
) -> tuple[int, list[tuple[str, int]]]:
    """How many live memories the caller can see, and (optionally) how many per group: the
    largest `max_groups` groups, ties by value. Counted in SQL under the same predicate as every
    other read, so a count never includes a row the caller could not fetch. One statement, so
    the total and the groups come from one snapshot (the window sums every group before the
    LIMIT keeps the largest)."""
    if group_by is None:
        total = await session.scalar(scope.select(func.count()).where(*filters.conditions()))
        return int(total or 0), []
    column = GROUPABLE[group_by]
    size = func.count().label("size")
    rows = (
        await session.execute(
            scope.select(column, size, func.sum(func.count()).over().label("total"))
            .where(*filters.conditions())
            .group_by(column)
            .order_by(size.desc(), column)
            .limit(max_groups)
        )
    ).all()
    total = int(rows[0].total) if rows else 0
    return total, [(str(value), int(n)) for value, n, _ in rows]


def _visible_rows_up_to(scope: Visible, filters: MemoryFilters, limit: int) -> ScalarSelect[int]:
    """How many rows a search would rank, counted no further than `limit` (an index-only scan
    of the narrow count index that stops there): what picks the search path."""
    capped = scope.select(literal(1)).where(*filters.conditions()).limit(limit).subquery()
    return select(func.count()).select_from(capped).scalar_subquery()


class ReadCancelled(Exception):
    """A read ran past its `statement_timeout` and the database cancelled it (SQLSTATE 57014);
    the transaction is aborted, so nothing it began is kept."""


@dataclass
class ReadBudget:
    """The statement timeout a block of reads runs under, and the one to restore after it."""

    before: str
    restored: bool = False

    def restoring(self) -> ColumnElement[str]:
        """A column that restores the previous timeout, for the block's *last* statement: the
        statement's own timer was armed with the budget when it began, so this bounds only
        what follows. Mark `restored` once that statement has returned a row (a select list
        is evaluated only for rows that come back)."""
        return func.set_config(
            "statement_timeout", bindparam("restore_timeout", self.before, type_=Text), True
        )


_SET_READ_BUDGET = built_once(
    select(
        func.current_setting("statement_timeout"),
        func.set_config("statement_timeout", bindparam("budget", type_=Text), True),
    )
)
"""Every read's budget, set in one round trip on the driver; answers the timeout before it."""


@asynccontextmanager
async def read_budget(session: AsyncSession, timeout_ms: int) -> AsyncIterator[ReadBudget]:
    """Run the reads inside under a `statement_timeout` of `timeout_ms` (transaction-local),
    then restore the previous one, so the audit append and commit that follow are not held to
    a read's budget: in the reads' last statement when it can (`ReadBudget.restoring`), else
    in one more. A cancelled read raises `ReadCancelled` (the database's words stay out)."""
    (answer,) = await run(session, _SET_READ_BUDGET, {"budget": f"{timeout_ms}ms"})
    budget = ReadBudget(str(answer[0]))
    try:
        yield budget
    except DBAPIError as exc:
        if getattr(exc.orig, "sqlstate", None) == QUERY_CANCELED:
            raise ReadCancelled from None
        raise
    # (A cancelled statement aborts the transaction, so there is nothing to restore then.)
    if not budget.restored:
        await _set_local(
            session, {"statement_timeout": budget.before}, answering="statement_timeout"
        )


WALK_PLANNED_EACH_TIME = {"plan_cache_mode": "force_custom_plan"}
"""A walk is planned for its own call even once its statement is prepared: which ANN index
serves a tenant (a partial index whose predicate names it, issue 17) and the walk's settings
are only known with its values. The exact statements may take PostgreSQL's generic plan:
every partial index they can use has a constant predicate (docs/architecture.md, "Prepared
statements")."""


@dataclass(frozen=True)
class AnnTuning:
    ef_search: int
    max_scan_tuples: int


async def search_approximate(
    session: AsyncSession,
    scope: Visible,
    query_vector: list[float],
    filters: MemoryFilters,
    *,
    k: int,
    tuning: AnnTuning,
) -> list[Hit]:
    """Approximate pre-filtered kNN: walk the HNSW index (ix_memories_embedding_hnsw) nearest
    first with pgvector's iterative scan in strict order, keeping rows that pass Visible, until
    k are found or `max_scan_tuples` are spent (then fewer than k come back), and re-sort them
    by exact distance. No score floor here: the caller decides from all k whether the walk's
    answer stands.

    Sorting is disabled for this one statement so the k nearest can only come from the index
    walk, never from a sort of every visible row; it is restored before anything else runs in
    the transaction (by the walk itself when it answers: one round trip less)."""
    distance = Memory.embedding.cosine_distance(query_vector)
    nearest = (
        scope.select(Memory.id.label("id"), distance.label("distance"))
        .where(*filters.vector_conditions())
        .order_by(distance)
        .limit(k)
        .cte("nearest")
        .prefix_with("MATERIALIZED")
    )
    walk = {
        "hnsw.iterative_scan": "strict_order",
        "hnsw.ef_search": str(tuning.ef_search),
        "hnsw.max_scan_tuples": str(tuning.max_scan_tuples),
        "enable_sort": "off",
        **WALK_PLANNED_EACH_TIME,
    }
    sorting = await _set_local(session, walk, answering="enable_sort")
    # The walk itself turns sorting back on: the planner read the setting before the
    # statement ran, so this changes only what runs after it.
    restore = func.set_config("enable_sort", sorting, True)
    rows = (await session.execute(_fetch(scope, nearest, restore))).all()
    # (A failed statement aborts the transaction, so there is nothing to restore then.)
    if not rows:  # a select list is evaluated only for the rows that come back
        await _set_local(session, {"enable_sort": sorting}, answering="enable_sort")
    return _hits(rows)


async def _set_local(session: AsyncSession, settings: dict[str, str], *, answering: str) -> str:
    """Transaction-local settings (`SET LOCAL`) in one round trip; answers the value
    `answering` had before (the select list is read left to right)."""
    before = func.current_setting(answering)
    changes = (func.set_config(name, value, True) for name, value in settings.items())
    return str(await session.scalar(select(before, *changes)))


async def search_exact(
    session: AsyncSession,
    scope: Visible,
    query_vector: list[float],
    filters: MemoryFilters,
    *,
    k: int,
    min_score: float | None,
) -> list[Hit]:
    """Exact pre-filtered kNN in one statement: the k nearest visible rows by a top-N sort
    over an index-only scan of the covering index (when no filter needs the heap), then the
    answer's columns of those k by primary key. Complete by construction: if k visible rows
    exist, k come back."""
    statement = _exact(scope, query_vector, filters, k=k, min_score=min_score)
    return _hits((await session.execute(statement)).all())


async def search_exact_within(
    session: AsyncSession,
    scope: Visible,
    query_vector: list[float],
    filters: MemoryFilters,
    *,
    k: int,
    min_score: float | None,
    size_limit: int,
    count_limit: int,
    budget: ReadBudget | None = None,
) -> list[Hit] | int:
    """`search_exact` if the caller's spaces hold at most `size_limit` live rows; else how many
    rows the caller sees, counted up to `count_limit` + 1 (nothing ranked: the caller takes the
    approximate path, or refuses a search that covers more than `count_limit`).

    The same statement sizes the set first, on the narrow count index and no further than
    `size_limit` + 1, and skips the ranking when it is too large, so the choice costs no round
    trip; the size is an upper bound (`live_rows_up_to`: rows the caller may not read count),
    which only ever sends a search to the approximate path, whose exact fallback keeps it
    complete. A `budget` is restored by this statement when it answers. Only an empty answer
    costs one statement more: it tells "nothing matches" from "too large to rank" and counts
    what the caller really sees, for the cap."""
    restore = None if budget is None else budget.restoring()
    statement = _exact(
        scope,
        query_vector,
        filters,
        k=k,
        min_score=min_score,
        size_limit=size_limit,
        restore=restore,
    )
    hits = _hits((await session.execute(statement)).all())
    if hits:
        if budget is not None:
            budget.restored = True
        return hits
    sized = await _sized(session, scope, filters, size_limit, count_limit)
    return hits if sized is None else sized


async def _sized(
    session: AsyncSession,
    scope: Visible,
    filters: MemoryFilters,
    size_limit: int,
    count_limit: int,
) -> int | None:
    """After an empty answer of a size-gated statement: None if the set was ranked (nothing
    is visible, or a score floor cut everything), else how many rows the caller sees (up to
    `count_limit` + 1). One statement tells them apart, whatever a walk would find."""
    limit = max(size_limit, count_limit) + 1
    bound = live_rows_up_to(scope, size_limit + 1, *filters.conditions())
    sized = select(bound, _visible_rows_up_to(scope, filters, limit))
    upper, counted = (await session.execute(sized)).one()
    ranked = int(upper) <= size_limit
    return None if ranked or int(counted) == 0 else int(counted)


def _exact(
    scope: Visible,
    query_vector: list[float],
    filters: MemoryFilters,
    *,
    k: int,
    min_score: float | None,
    size_limit: int | None = None,
    restore: ColumnElement[str] | None = None,
) -> Select[Any]:
    """`ORDER BY distance LIMIT k` over the visible rows, the plan a hand-written query gets
    (a top-N heapsort over the tenant's covering index), then a join on the primary key for
    the answer's columns of the k winners.

    The scored rows sit behind `OFFSET 0`, which keeps them a subquery the planner does not
    flatten: the ordering can then never be pushed into the scan, where an ANN index (HNSW,
    IVFFlat) on `embedding` would rank the nearest rows of the whole table first and filter
    after, answering fewer than k (often zero) hits. Unlike a materialized CTE over every
    visible row, the fence stores nothing."""
    distance = Memory.embedding.cosine_distance(query_vector)
    scored = scope.select(Memory.id.label("id"), distance.label("distance")).where(
        *filters.vector_conditions()
    )
    if min_score is not None:
        scored = scored.where(distance <= 1.0 - min_score)
    if size_limit is not None:
        # An uncorrelated condition: evaluated once, before the scan, which it can skip.
        bound = live_rows_up_to(scope, size_limit + 1, *filters.conditions())
        scored = scored.where(bound <= size_limit)
    fenced = scored.offset(0).subquery("scored")
    ranked = (
        select(fenced.c.id, fenced.c.distance)
        .order_by(fenced.c.distance, fenced.c.id)
        .limit(k)
        .cte("ranked")
        .prefix_with("MATERIALIZED")
    )
    return _fetch(scope, ranked, restore)


def _fetch(scope: Visible, ranked: CTE, restore: ColumnElement[str] | None = None) -> Select[Any]:
    """The answer's columns of the ranked rows, nearest first, by primary key (the Visible
    predicate again, a recheck of k rows), as Core rows: no ORM entity is built."""
    extra = () if restore is None else (restore.label("restored"),)
    return (
        scope.select(*ANSWER, (1.0 - ranked.c.distance).label("score"), *extra)
        .join(ranked, and_(Memory.tenant_id == scope.tenant, Memory.id == ranked.c.id))
        .order_by(ranked.c.distance, Memory.id)
    )


def _hits(rows: Sequence[Row[Any]]) -> list[Hit]:
    return [(cast_row(row), float(row.score)) for row in rows]


RRF_K = 60
"""Reciprocal rank fusion's constant (Cormack, Clarke and Buettcher, SIGIR 2009): a candidate's
fused value is the sum, over the legs that ranked it, of 1 / (RRF_K + its rank there). The
paper's 60 flattens the top ranks, so a row both legs place well beats one a single leg puts
first, and no leg's raw scores (cosines, term weights) have to be made comparable."""


@dataclass(frozen=True)
class Fusion:
    """How a hybrid (or lexical-only) search ranks and admits its hits."""

    text: str
    """The query text, parsed into terms with `config` (the words written rows were parsed with)."""
    config: str
    """The tenant's text search configuration."""
    depth: int
    """How many candidates each leg ranks (at least k, so either leg alone can fill it)."""
    vector_floor: float | None
    """The cosine that admits a hit (None: no floor)."""
    lexical_floor: float | None
    """The share of the query's term weight that admits a hit below the cosine floor (None:
    any matching row is admitted, the floor is off)."""
    lexical_only: bool = False
    """Only the lexical leg ranks (its hits still carry their cosine)."""

    def template(self) -> Fusion:
        """Placeholder values of this shape (which floors are set, which legs rank)."""
        return replace(
            self,
            text="",
            config="simple",
            depth=1,
            vector_floor=None if self.vector_floor is None else 1.0,
            lexical_floor=None if self.lexical_floor is None else 1.0,
        )


def _terms(fusion: Fusion) -> ColumnElement[Any]:
    """The query's distinct lexemes under the tenant's configuration (stop words of a language
    configuration dropped), as `text[]`: a constant the planner folds once per statement."""
    config = cast(bindparam("text_config", fusion.config, type_=Text), REGCONFIG)
    text = bindparam("query_text", fusion.text, type_=Text)
    return func.tsvector_to_array(func.to_tsvector(config, text), type_=ARRAY(Text))


def _depth(fusion: Fusion) -> ColumnElement[int]:
    return bindparam("fusion_depth", fusion.depth, type_=Integer)


def _vector_floor(fusion: Fusion) -> ColumnElement[float]:
    return bindparam("vector_floor", fusion.vector_floor, type_=Float)


def _quoted(term: ColumnElement[Any]) -> ColumnElement[str]:
    """A lexeme as tsquery text, quoted, so nothing in the query is read as tsquery syntax."""
    escaped = func.replace(func.replace(term, "\\", "\\\\"), "'", "''")
    return literal("'", Text) + escaped + literal("'", Text)


def _query_terms(fusion: Fusion) -> tuple[CTE, ScalarSelect[Any]]:
    """(terms, any_term): the query's lexemes, each with its one-lexeme probe, and the query
    matching any of them (NULL when the query has no term, which matches nothing)."""
    term = func.unnest(_terms(fusion)).table_valued("term", name="query_terms").render_derived()
    terms = (
        select(term.c.term, cast(_quoted(term.c.term), TSQUERY).label("probe"))
        .select_from(term)
        .cte("terms")
    )
    any_term = select(
        cast(func.string_agg(_quoted(terms.c.term), literal(" | ", Text)), TSQUERY)
    ).scalar_subquery()
    return terms, any_term


def _seen(
    scope: Visible,
    query_vector: list[float],
    filters: MemoryFilters,
    any_term: ScalarSelect[Any],
    gate: list[ColumnElement[bool]],
) -> CTE:
    """Every visible row once, with its cosine distance and, when it matches a query term, its
    lexemes (NULL otherwise, so only matching rows carry them): the one scan of the table an
    exact hybrid search makes. Each scan of `memories` also costs its row-level security
    checks, so reading the set once for both legs and the idf count is most of the saving."""
    distance = filters.cosine_distance(query_vector)
    matching = case((Memory.lexical.op("@@")(any_term), Memory.lexical), else_=null())
    return (
        scope.select(Memory.id.label("id"), distance.label("distance"), matching.label("lexical"))
        .where(*filters.conditions(), *gate)
        .cte("seen")
        .prefix_with("MATERIALIZED")
    )


def _nearest_seen(seen: CTE, depth: ColumnElement[int]) -> FromClause:
    """The vector leg of an exact hybrid search: the `depth` nearest of the seen rows of the
    query's model (a row of another model has no distance; only its words can find it)."""
    return (
        select(seen.c.id, seen.c.distance)
        .where(seen.c.distance.is_not(None))
        .order_by(seen.c.distance, seen.c.id)
        .limit(depth)
        .subquery("nearest")
    )


def _lexical_leg(
    scope: Visible,
    query_vector: list[float],
    filters: MemoryFilters,
    fusion: Fusion,
    gate: list[ColumnElement[bool]],
    *,
    seen: CTE | None = None,
    query_terms: tuple[CTE, ScalarSelect[Any]] | None = None,
) -> tuple[CTE, CTE]:
    """(weights, ranked): every visible row matching a query term with its cosine distance and
    its weight, and the `depth` heaviest of them with their rank.

    A row's weight is the share of the query's term weight it holds, each term weighted by its
    rarity among the rows the caller sees (BM25's idf: ln(1 + (N - df + 0.5) / (df + 0.5)),
    N = visible rows, df = visible rows holding the term). Under the `simple` configuration
    "is" and "the" are in nearly every row, so they weigh nearly nothing and a row matching
    only them never reaches the lexical floor. Rarity is counted over the caller's own visible
    rows only: counting other spaces' rows would let their words move the caller's ranks.

    Each (row, term) pair is tested once with `@@` on a one-lexeme query (a binary search in
    the row's sorted lexemes), not by comparing text arrays.

    `seen` (`_seen`): the visible rows, already read once for the vector leg, with the
    lexemes of those matching a term; the pool and the count come from it instead of two
    more scans of the table."""
    terms, any_term = query_terms if query_terms is not None else _query_terms(fusion)
    if seen is None:
        distance = filters.cosine_distance(query_vector)
        pool: CTE = (
            scope.select(Memory.id.label("id"), distance.label("distance"), Memory.lexical)
            .where(*filters.conditions(), Memory.lexical.op("@@")(any_term), *gate)
            .cte("pool")
            .prefix_with("MATERIALIZED")
        )
        # Behind the same size gate as the pool: a set too large to rank is not counted either.
        visible_rows = (
            scope.select(func.count()).where(*filters.conditions(), *gate).scalar_subquery()
        )
    else:
        pool = (
            select(seen.c.id, seen.c.distance, seen.c.lexical)
            .where(seen.c.lexical.is_not(None))
            .cte("pool")
        )
        visible_rows = select(func.count()).select_from(seen).scalar_subquery()
    held = (
        select(pool.c.id, pool.c.distance, terms.c.term)
        .select_from(pool.join(terms, pool.c.lexical.op("@@")(terms.c.probe)))
        .cte("held")
        .prefix_with("MATERIALIZED")
    )
    df = (
        select(terms.c.term, func.count(held.c.id).label("df"))
        .select_from(terms.outerjoin(held, held.c.term == terms.c.term))
        .group_by(terms.c.term)
        .subquery("df")
    )
    idf_value = func.ln(1.0 + (visible_rows - df.c.df + 0.5) / (df.c.df + 0.5))
    idf = select(df.c.term, idf_value.label("idf")).cte("idf")
    total = select(func.sum(idf.c.idf)).scalar_subquery()
    share = func.least(func.sum(idf.c.idf) / func.nullif(total, 0), 1.0)  # rounding past 1
    weights = (
        select(held.c.id, held.c.distance, cast(share, Float).label("weight"))
        .select_from(held.join(idf, idf.c.term == held.c.term))
        .group_by(held.c.id, held.c.distance)
        .cte("weights")
    )
    heaviest = (
        select(weights.c.id, weights.c.weight)
        .order_by(weights.c.weight.desc(), weights.c.id)
        .limit(_depth(fusion))
        .subquery("heaviest")
    )
    order = (heaviest.c.weight.desc(), heaviest.c.id)
    ranked = select(heaviest.c.id, func.row_number().over(order_by=order).label("rank")).cte(
        "lexical_ranked"
    )
    return weights, ranked


def _vector_ranked(nearest: FromClause) -> CTE:
    """Ranks (1 = nearest) over a leg's `depth` nearest (id, distance) rows."""
    order = (nearest.c.distance, nearest.c.id)
    return select(
        nearest.c.id, nearest.c.distance, func.row_number().over(order_by=order).label("rank")
    ).cte("vector_ranked")


def _candidates(vector: CTE | None, lexical: CTE, weights: CTE) -> FromClause:
    """The union of both legs' `depth` best, one row each: its cosine distance, its rank in
    each leg that ranked it, and its term weight (NULL: it matches no term). A row the vector
    leg alone ranked may still match a term below the lexical leg's `depth`; its weight comes
    from `weights`.

    One grouped UNION ALL (a hash aggregate over the legs' rows and the matching rows), not
    joins: the planner cannot estimate the CTEs' sizes and joined them in a nested loop that
    compared every candidate with every matching row (125 x 1,000 per search, 14 ms)."""
    missing_rank = cast(null(), BigInteger)
    missing = cast(null(), Float)
    legs = [
        select(
            lexical.c.id,
            missing.label("distance"),
            missing_rank.label("vector_rank"),
            lexical.c.rank.label("lexical_rank"),
            missing.label("weight"),
        ),
        select(
            weights.c.id,
            weights.c.distance,
            missing_rank,
            missing_rank,
            weights.c.weight,
        ),
    ]
    if vector is not None:
        legs.append(select(vector.c.id, vector.c.distance, vector.c.rank, missing_rank, missing))
    rows = union_all(*legs).subquery("legs")
    vector_rank, lexical_rank = func.min(rows.c.vector_rank), func.min(rows.c.lexical_rank)
    return (
        select(
            rows.c.id,
            func.min(rows.c.distance).label("distance"),
            vector_rank.label("vector_rank"),
            lexical_rank.label("lexical_rank"),
            func.max(rows.c.weight).label("weight"),
        )
        .group_by(rows.c.id)
        .having(or_(vector_rank.is_not(None), lexical_rank.is_not(None)))
        .subquery("candidates")
    )


def _fused(
    scope: Visible,
    query_vector: list[float],
    filters: MemoryFilters,
    fusion: Fusion,
    *,
    k: int,
    nearest: FromClause | None,
    gate: list[ColumnElement[bool]],
    restore: ColumnElement[str] | None = None,
    seen: CTE | None = None,
    query_terms: tuple[CTE, ScalarSelect[Any]] | None = None,
) -> Select[Any]:
    """One statement: both legs from the same `scope`, fused, the floor applied, the k best
    fetched. `nearest` is the vector leg's (id, distance) rows (exact or walked; None for a
    lexical-only search). Candidates are the union of both legs' `depth` best; a candidate is
    admitted when its cosine clears the vector floor or its weight the lexical floor. Both
    admitted sets are prefixes of their leg's order, so with depth >= k the answer holds k
    rows whenever k visible rows clear the floor (never under-filled)."""
    weights, lexical = _lexical_leg(
        scope, query_vector, filters, fusion, gate, seen=seen, query_terms=query_terms
    )
    vector = None if nearest is None else _vector_ranked(nearest)
    cand = _candidates(vector, lexical, weights)
    rrf = func.coalesce(1.0 / (RRF_K + cand.c.vector_rank), 0.0) + func.coalesce(
        1.0 / (RRF_K + cand.c.lexical_rank), 0.0
    )
    admitted: ColumnElement[bool] = literal(True)
    if fusion.lexical_floor is not None:
        by_words = cand.c.weight >= bindparam("lexical_floor", fusion.lexical_floor, type_=Float)
        if fusion.vector_floor is not None and not fusion.lexical_only:
            admitted = or_(cand.c.distance <= 1.0 - _vector_floor(fusion), by_words)
        else:
            admitted = by_words
    scored = select(
        cand.c.id,
        cand.c.distance,
        cand.c.weight,
        cast(rrf, Float).label("fused"),
        func.coalesce(admitted, False).label("admitted"),
    ).subquery("scored_candidates")
    ranked = (
        select(scored.c.id, scored.c.distance, scored.c.weight, scored.c.fused)
        .where(scored.c.admitted)
        .order_by(scored.c.fused.desc(), scored.c.distance, scored.c.id)
        .limit(bindparam("k", k, type_=Integer))
        .cte("fused")
        .prefix_with("MATERIALIZED")
    )
    extra = [] if restore is None else [restore.label("restored")]
    if vector is not None:
        cleared = select(func.count()).select_from(vector)
        if fusion.vector_floor is not None:
            cleared = cleared.where(vector.c.distance <= 1.0 - _vector_floor(fusion))
        extra.append(cleared.scalar_subquery().label("vector_cleared"))
    return (
        scope.select(
            *ANSWER,
            (1.0 - ranked.c.distance).label("score"),
            ranked.c.weight.label("lexical_score"),
            ranked.c.fused.label("fused_score"),
            *extra,
        )
        .join(ranked, and_(Memory.tenant_id == scope.tenant, Memory.id == ranked.c.id))
        .order_by(ranked.c.fused.desc(), ranked.c.distance, Memory.id)
    )


def _fused_hits(rows: Sequence[Row[Any]]) -> list[FusedHit]:
    return [
        FusedHit(
            cast_row(row),
            None if row.score is None else float(row.score),
            None if row.lexical_score is None else float(row.lexical_score),
            float(row.fused_score),
        )
        for row in rows
    ]


_FUSED_SHAPES: dict[tuple[Any, ...], Select[Any]] = {}
"""`_fused_within`'s statements, one per shape, built once from placeholder values and run on
the driver (service/db/driver.py)."""


def _fused_within(
    scope: Visible,
    query_vector: list[float],
    filters: MemoryFilters,
    fusion: Fusion,
    *,
    k: int,
    size_limit: int | None,
    budget: ReadBudget | None,
) -> tuple[Select[Any], dict[str, Any]]:
    """The exact hybrid (or lexical) statement and its parameters. Building it costs more CPU
    than PostgreSQL spends running it, so each shape (what kind of caller, which filters and
    floors are set, whether gated or budgeted) is built once from placeholders, and every
    value a request brings (the caller's ids, the query, k, the floors, the limits) is one of
    its named parameters. A value left out of the parameters would run with its placeholder
    and match nothing, never another caller's value. Time travel is built per request."""
    if scope.caller is None or scope.moment is not None or scope.action is not Action.READ:
        statement = _build_fused_within(
            scope, query_vector, filters, fusion, k=k, size_limit=size_limit, budget=budget
        )
        return statement, {}
    shape = (
        shape_of(scope.caller),
        filters.shape(),
        fusion.lexical_only,
        fusion.vector_floor is None,
        fusion.lexical_floor is None,
        size_limit is None,
        budget is None,
        len(query_vector),
    )
    cached = _FUSED_SHAPES.get(shape)
    if cached is None:
        cached = _FUSED_SHAPES[shape] = built_once(
            _build_fused_within(
                visible(template_caller(scope.caller), Action.READ),
                [0.0] * len(query_vector),
                filters.template(),
                fusion.template(),
                k=1,
                size_limit=None if size_limit is None else 0,
                budget=None if budget is None else ReadBudget("0"),
            )
        )
    params: dict[str, Any] = {
        **bound_values(scope.caller),
        **filters.values(),
        "query_vector": query_vector,
        "query_text": fusion.text,
        "text_config": fusion.config,
        "fusion_depth": fusion.depth,
        "vector_floor": fusion.vector_floor,
        "lexical_floor": fusion.lexical_floor,
        "k": k,
    }
    if size_limit is not None:
        params |= {"size_probe": size_limit + 1, "size_limit": size_limit}
    if budget is not None:
        params["restore_timeout"] = budget.before
    return cached, params


def _build_fused_within(
    scope: Visible,
    query_vector: list[float],
    filters: MemoryFilters,
    fusion: Fusion,
    *,
    k: int,
    size_limit: int | None,
    budget: ReadBudget | None,
) -> Select[Any]:
    gate: list[ColumnElement[bool]] = []
    if size_limit is not None:
        probe = bindparam("size_probe", size_limit + 1, type_=Integer)
        bound = live_rows_up_to(scope, probe, *filters.conditions())
        gate.append(bound <= bindparam("size_limit", size_limit, type_=Integer))
    restore = None if budget is None else budget.restoring()
    if fusion.lexical_only:
        # The pool is found through the lexical index: no scan of every visible row.
        return _fused(
            scope, query_vector, filters, fusion, k=k, nearest=None, gate=gate, restore=restore
        )
    query_terms = _query_terms(fusion)
    seen = _seen(scope, query_vector, filters, query_terms[1], gate)
    return _fused(
        scope,
        query_vector,
        filters,
        fusion,
        k=k,
        nearest=_nearest_seen(seen, _depth(fusion)),
        gate=gate,
        restore=restore,
        seen=seen,
        query_terms=query_terms,
    )


async def search_fused_within(
    session: AsyncSession,
    scope: Visible,
    query_vector: list[float],
    filters: MemoryFilters,
    fusion: Fusion,
    *,
    k: int,
    size_limit: int | None,
    count_limit: int,
    budget: ReadBudget | None = None,
) -> list[FusedHit] | int:
    """`search_exact_within` for a hybrid or lexical search: both legs ranked exactly in one
    statement if the caller's spaces hold at most `size_limit` live rows (None: whatever the
    size, for a lexical-only search or the fallback of a walk); else how many rows the caller
    sees, up to `count_limit` + 1, and nothing ranked."""
    statement, params = _fused_within(
        scope, query_vector, filters, fusion, k=k, size_limit=size_limit, budget=budget
    )
    hits = _fused_hits(await run(session, statement, params))
    if hits or size_limit is None:
        if hits and budget is not None:
            budget.restored = True
        return hits
    sized = await _sized(session, scope, filters, size_limit, count_limit)
    return hits if sized is None else sized


async def search_fused_approximate(
    session: AsyncSession,
    scope: Visible,
    query_vector: list[float],
    filters: MemoryFilters,
    fusion: Fusion,
    *,
    k: int,
    tuning: AnnTuning,
) -> tuple[list[FusedHit], int]:
    """A hybrid search whose vector leg walks the HNSW index (as `search_approximate` does, for
    `depth` rows) and whose lexical leg is exact, in one statement; also answers how many of
    the walk's rows clear the vector floor (the answer stands only when at least k do)."""
    distance = Memory.embedding.cosine_distance(query_vector)
    nearest = (
        scope.select(Memory.id.label("id"), distance.label("distance"))
        .where(*filters.vector_conditions())
        .order_by(distance)
        .limit(fusion.depth)
        .cte("nearest")
        .prefix_with("MATERIALIZED")
    )
    walk = {
        "hnsw.iterative_scan": "strict_order",
        "hnsw.ef_search": str(max(tuning.ef_search, fusion.depth)),
        "hnsw.max_scan_tuples": str(tuning.max_scan_tuples),
        "enable_sort": "off",
        **WALK_PLANNED_EACH_TIME,
    }
    sorting = await _set_local(session, walk, answering="enable_sort")
    restore = func.set_config("enable_sort", sorting, True)
    statement = _fused(
        scope, query_vector, filters, fusion, k=k, nearest=nearest, gate=[], restore=restore
    )
    rows = (await session.execute(statement)).all()
    if not rows:
        await _set_local(session, {"enable_sort": sorting}, answering="enable_sort")
        return [], 0
    return _fused_hits(rows), int(rows[0].vector_cleared)


async def key_of(session: AsyncSession, scope: Visible, memory_id: uuid.UUID) -> KeyRef | None:
    """The key of any version by id, a revoked (hidden) one too: DELETE reaches revoked rows
    (retracting one takes its content out and reveals nothing; docs/revocation.md)."""
    row = (
        await session.execute(
            scope.select(
                Memory.tenant_id,
                Memory.space_id,
                Memory.subject,
                Memory.kind,
                Memory.key,
                Memory.read_requires,
                liveness=Liveness.including_revoked(),
            ).where(Memory.id == memory_id)
        )
    ).one_or_none()
    return None if row is None else KeyRef.of(row)


async def live_versions(
    session: AsyncSession, scope: Visible, refs: Sequence[KeyRef]
) -> dict[KeyRef, Version]:
    """The live version of each key of `refs` under `scope` (a key without one is absent): what
    an `If-Match` is compared with (service/memory/etags.py). Asked only of changes that carry a
    precondition, under the keys' locks, so the answer holds until the change commits."""
    found: dict[KeyRef, Version] = {}
    for ref in dict.fromkeys(refs):
        row = (
            await session.execute(
                scope.select(Memory.id, Memory.version).where(
                    Memory.space_id == ref.space_id,
                    Memory.subject == ref.subject,
                    Memory.kind == ref.kind,
                    Memory.key == ref.key,
                    Memory.read_requires == cast(list(ref.read_requires), _UUIDS),
                    # A waiting proposal is unsuperseded too, and visible to its writer and
                    # the reviewers: it is no version of the key (issue 15, finding 4).
                    Memory.review_state.is_(None),
                )
            )
        ).one_or_none()
        if row is not None:
            found[ref] = Version(row[0], row[1])
    return found


async def retract(
    session: AsyncSession,
    scope: Visible,
    memory_id: uuid.UUID,
    at: datetime,
    *,
    expired_too: bool = False,
) -> bool:
    """Retract one version: its row stays in the chain as a content-free stub (value, vector,
    content hash, metadata and source cleared; `retracted_at` set) that keeps its id, number
    and links, so no number is issued twice and history shows where a version was. A live head
    is closed at `at` too, so the key has no live value (the older one does not come back)
    and the stub leaves every partial live index. Under `scope` (delete); row-level security
    lets a deleter without write make exactly this change (migration `stable_versions`).
    `expired_too`: an expired version is retracted as well (a job taking derived text down:
    an expired row is out of reads now, but its text would come back with its expiry).
    A revoked (hidden) version is retracted too: it stays hidden (`revoked_at` is kept, so a
    reinstatement never brings a stub back as live) and its content leaves storage without
    first being reinstated (docs/revocation.md, "Deleting a revoked memory")."""
    liveness = Liveness.including_revoked()
    retracted = await session.scalars(
        scope.update(liveness=liveness.with_expired() if expired_too else liveness)
        .where(Memory.id == memory_id)
        .values(_stub(at))
        .returning(Memory.id)
    )
    return retracted.one_or_none() is not None


def _stub(at: datetime) -> dict[Any, Any]:
    """What a retraction sets (the exact change the `memories_retract_only` trigger admits)."""
    return {
        Memory.retracted_at: at,
        Memory.superseded_at: func.coalesce(Memory.superseded_at, at),
        Memory.value: "",
        Memory.value_sealed: None,
        Memory.value_key: None,
        Memory.content_hash: b"",
        Memory.embedding: None,
        Memory.metadata_: {},
        Memory.source: None,
    }


async def retract_derived_summaries(
    session: AsyncSession, scope: Visible, source_id: uuid.UUID, at: datetime
) -> list[uuid.UUID]:
    """Retract, with the deletion of `source_id`, every version (live, superseded, expired) of
    a consolidation summary built from it that `scope` (the deleter's delete predicate) may
    retract: each holds its text. Summaries the deleter may not retract (another audience)
    are left to the job's next run, which retracts them (docs/jobs.md). Hidden ones (the
    revocation of their source hid them) are retracted too: they hold its text."""
    retracted = await session.scalars(
        scope.update(liveness=Liveness.including_revoked().with_expired())
        .where(
            Memory.kind == SUMMARY_KIND,
            Memory.key.in_(RESERVED_KEYS),
            Memory.derived_from.contains(cast(literal([source_id], ARRAY(UUID)), ARRAY(UUID))),
        )
        .values(_stub(at))
        .returning(Memory.id)
    )
    return list(retracted.all())


def _walk(
    scope: Visible, start: ColumnElement[bool], name: str, *, forward: bool, hops: int
) -> CTE:
    """One direction of a chain walk from the row `start` picks: along `superseded_by`
    (forward) or `supersedes`, each hop a row source bound to the predicate and naming the
    version it came from (both links agree), at most `hops` hops. Columns: id, next, depth."""
    ahead, behind = ("superseded_by", "supersedes") if forward else ("supersedes", "superseded_by")
    walked = (
        scope.select(
            Memory.id,
            getattr(Memory, ahead).label("next"),
            literal(0).label("depth"),
            liveness=_HISTORY,
        )
        .where(start)
        .cte(name, recursive=True)
    )
    hop = Memory.__table__.alias(f"{name}_hop")
    return walked.union_all(
        scope.select(hop.c.id, hop.c[ahead], walked.c.depth + 1, liveness=_HISTORY, on=hop)
        .join(walked, hop.c.id == walked.c.next)
        .where(hop.c[behind] == walked.c.id, walked.c.depth < hops)
    )


async def history(
    session: AsyncSession,
    scope: Visible,
    start: uuid.UUID,
    *,
    newer_hops: int,
    older_hops: int,
    skip_start: bool,
    restore: ColumnElement[str] | None = None,
) -> Sequence[Row[Any]]:
    """A version chain, newest first, in one statement (two recursive walks): from `start`
    forward along `superseded_by` (at most `newer_hops` hops) to the newest version the caller
    can see, then back from there along `supersedes`, at most `older_hops` hops. Every hop is
    a row source bound to the predicate (`Visible.select(on=...)`), so each walk stops at the
    first version the caller cannot see, never skipping over it; a hop must also name the
    version it came from (both links agree). `skip_start` leaves the start out (a cursor
    names the last version already shown). Nothing comes back when `start` is not visible."""
    newer = _walk(scope, Memory.id == start, "newer", forward=True, hops=newer_hops)
    head = select(newer.c.id).order_by(newer.c.depth.desc()).limit(1).scalar_subquery()
    older = _walk(scope, Memory.id == head, "older", forward=False, hops=older_hops)
    extra = () if restore is None else (restore.label("restored"),)
    statement = (
        scope.select(*ANSWER, *extra, liveness=_HISTORY)
        .join(older, and_(Memory.tenant_id == scope.tenant, Memory.id == older.c.id))
        .order_by(older.c.depth)
    )
    if skip_start:
        statement = statement.where(older.c.depth > 0)
    rows: Sequence[Row[Any]] = (await session.execute(statement)).all()
    return rows


@dataclass(frozen=True)
class AgedBatch:
    examined: int
    """Live rows of spaces with `max_unused_days` looked at (at most the batch size)."""
    unused: list[uuid.UUID]
    """Those neither written nor recalled within their space's `max_unused_days`."""
    last: uuid.UUID | None
    """The last row examined (where the next batch starts)."""
    summaries: list[uuid.UUID] = field(default_factory=list)
    """Live consolidation summaries expired with them: each was derived from one of them."""


def _last_used_day() -> ColumnElement[Any]:
    """The UTC day a row was last written (`recorded_at`) or recalled (`memory_recalls`,
    whichever is later; `greatest` skips a missing recall)."""
    written = cast(func.timezone("UTC", Memory.recorded_at), Date)
    return func.greatest(written, MemoryRecall.recalled_on)


async def age_unused(
    session: AsyncSession,
    scope: Visible,
    *,
    after: uuid.UUID | None,
    size: int,
    space_id: uuid.UUID | None,
    expire: bool,
) -> AgedBatch:
    """One batch of `memory.age_unused`, in one statement: the next `size` live rows (by id,
    after `after`) of the spaces whose settings give `max_unused_days`, under `scope` (the
    job principal's write predicate: it also reads them); those last used more than that many
    whole days ago (UTC) are unused; with `expire` their `expires_at` is set to now, in
    place: no new version, the chain unchanged, and every read leaves them out at once (the
    TTL sweep removes them later). Only rows with no earlier expiry are touched (an expired
    row is not live)."""
    days = cast(Space.settings["max_unused_days"].astext, Integer)
    today = cast(func.timezone("UTC", func.now()), Date)
    examined = (
        scope.select(Memory.id, (_last_used_day() < today - days).label("unused"))
        .join(Space, and_(Space.tenant_id == Memory.tenant_id, Space.id == Memory.space_id))
        .outerjoin(
            MemoryRecall,
            and_(MemoryRecall.tenant_id == Memory.tenant_id, MemoryRecall.memory_id == Memory.id),
        )
        .where(Space.settings.has_key("max_unused_days"))
    )
    if after is not None:
        examined = examined.where(Memory.id > after)
    if space_id is not None:
        examined = examined.where(Memory.space_id == space_id)
    batch = examined.order_by(Memory.id).limit(size).cte("examined").prefix_with("MATERIALIZED")
    unused = select(batch.c.id).where(batch.c.unused)
    if expire:
        touched = (
            scope.update()
            .where(Memory.id.in_(unused))
            .values(expires_at=func.now())
            .returning(Memory.id)
            .cte("expired")
        )
        # A summary never outlives an input (docs/jobs.md): the live summaries derived from
        # a row expired here expire with it, in this statement, so its text leaves every read
        # at once; the next consolidation run writes one without it. (The rows expired above
        # are left to that update: one statement never updates a row twice.)
        derived = (
            scope.update()
            .where(
                Memory.kind == SUMMARY_KIND,
                Memory.key.in_(RESERVED_KEYS),
                Memory.id.not_in(unused),
                Memory.derived_from.overlap(select(func.array_agg(touched.c.id)).scalar_subquery()),
            )
            .values(expires_at=func.now())
            .returning(Memory.id)
            .cte("expired_summaries")
        )
        picked = select(func.array_agg(touched.c.id)).scalar_subquery()
        summaries: ColumnElement[Any] = select(func.array_agg(derived.c.id)).scalar_subquery()
    else:
        picked = select(func.array_agg(batch.c.id)).where(batch.c.unused).scalar_subquery()
        summaries = null()
    statement = select(
        select(func.count()).select_from(batch).scalar_subquery(),
        picked,
        select(batch.c.id).order_by(batch.c.id.desc()).limit(1).scalar_subquery(),
        summaries,
    )
    count_, ids, last, derived_ids = (await session.execute(statement)).one()
    return AgedBatch(int(count_), list(ids or []), last, list(derived_ids or []))


@dataclass(frozen=True)
class StaleRow:
    """A version whose vector another model made: what re-embedding needs of it."""

    id: uuid.UUID
    value: str
    content_hash: bytes
    embedding_model: str


_STALE = Liveness.any_version()
"""Every version a read can reach (time travel ranks superseded ones too); retracted stubs
have no vector, and expired or revoked rows are re-embedded if they ever come back (a later
run finds them)."""


async def stale_embeddings(
    session: AsyncSession,
    scope: Visible,
    model: str,
    *,
    after: uuid.UUID | None,
    size: int,
    space_id: uuid.UUID | None,
) -> list[StaleRow]:
    """The next `size` versions (by id, after `after`) under `scope` whose vector was not made
    by `model`."""
    statement = scope.select(
        Memory.id,
        Memory.value,
        Memory.content_hash,
        Memory.embedding_model,
        *SEALING,
        liveness=_STALE,
    ).where(Memory.embedding_model != model, Memory.embedding.is_not(None))
    if after is not None:
        statement = statement.where(Memory.id > after)
    if space_id is not None:
        statement = statement.where(Memory.space_id == space_id)
    rows = (await session.execute(statement.order_by(Memory.id).limit(size))).all()
    # A sealed row is embedded from its opened text, never from its empty `value`.
    plain = await vault_of(session).plaintexts(rows)
    return [
        StaleRow(row.id, plain.get(row.id, row.value), row.content_hash, row.embedding_model)
        for row in rows
        if plain.get(row.id, row.value)  # a row whose key is destroyed has no text to embed
    ]


async def set_embeddings(
    session: AsyncSession,
    scope: Visible,
    model: str,
    fresh: Sequence[tuple[StaleRow, list[float]]],
) -> list[uuid.UUID]:
    """Store the new vectors and their model in one statement, in place (a vector is derived
    from the value, not a new version). A row is updated only if it is still what was embedded
    (same content hash, same old model): one retracted or re-embedded meanwhile is left alone."""
    if not fresh:
        return []
    given = values(
        column("id", UUID),
        column("content_hash", LargeBinary),
        column("old_model", Text),
        column("vector", Text),
        name="fresh",
    ).data(
        [
            (row.id, row.content_hash, row.embedding_model, _vector_text(vector))
            for row, vector in fresh
        ]
    )
    updated = await session.scalars(
        scope.update(liveness=_STALE)
        .where(
            Memory.id == given.c.id,
            Memory.content_hash == given.c.content_hash,
            Memory.embedding_model == given.c.old_model,
        )
        .values(embedding=cast(given.c.vector, Vector(EMBEDDING_DIMENSIONS)), embedding_model=model)
        .returning(Memory.id)
    )
    return list(updated.all())


def _vector_text(vector: list[float]) -> str:
    """pgvector's text form (`[1.0,2.0]`): the VALUES list carries it as text, cast once."""
    return "[" + ",".join(repr(float(v)) for v in vector) + "]"


__all__ = [
    "ANSWER",
    "GROUPABLE",
    "RRF_K",
    "SEALING",
    "AgedBatch",
    "AnnTuning",
    "FusedHit",
    "Fusion",
    "GateQuestion",
    "Hit",
    "KeyRef",
    "LiveKey",
    "MemoryFilters",
    "MemoryRow",
    "NewVersion",
    "ReadBudget",
    "ReadCancelled",
    "StaleRow",
    "SubjectKeys",
    "Supersession",
    "Version",
    "age_unused",
    "count",
    "get",
    "history",
    "insert",
    "insert_many",
    "key_of",
    "list_page",
    "live_keys_of_subjects",
    "lock_key",
    "lock_keys",
    "read_budget",
    "retract",
    "search_approximate",
    "search_exact",
    "search_exact_within",
    "search_fused_approximate",
    "search_fused_within",
    "set_embeddings",
    "stale_embeddings",
    "supersede",
    "supersede_many",
]
