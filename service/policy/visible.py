"""THE predicate. Every statement that reads (or targets) memory rows starts here.

`Visible(principal, action)` = tenant from the token AND the row's space among the spaces the
principal holds `action` on AND every space in `read_requires` among them too, plus liveness.
It is SQL, applied before any ranking; nothing is filtered in Python afterwards. The allowed
spaces are a subquery *inside* the statement, so grants and data are read in one snapshot and
a search is one round trip. No grants means an empty array, which matches nothing: never "no
filter". Which versions a statement sees is one `Liveness` value; the predicate binds to the
mapped class or to an alias or CTE (`on=`), so a history walk checks every hop.

Two checks hold the entrance (docs/architecture.md, "The one entrance"): an AST lint over
`service/` (tests/contract/test_visible_is_the_only_entrance.py) and, in the test harness, a
check on every statement sent that a read of the memory table carries `VISIBLE_MARK`.

The grants are the `space_grants` view over the compiled closures (service/policy/compile.py):
every principal starts with read, write and delete in its personal space; rules add the rest.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from functools import cached_property
from typing import Any, Generic, TypeVar

from sqlalchemy import (
    Boolean,
    ColumnElement,
    Delete,
    FromClause,
    ScalarSelect,
    Select,
    Text,
    Update,
    and_,
    any_,
    bindparam,
    cast,
    delete,
    func,
    literal,
    or_,
)
from sqlalchemy import select as sa_select
from sqlalchemy import update as sa_update
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased
from sqlalchemy.orm.util import AliasedClass

from service.auth.principal import GrantSnapshot, Principal
from service.auth.scopes import Scope
from service.db.driver import built_once, run
from service.db.models import Memory, Space, SpaceGrant
from service.observability.telemetry import span
from service.policy.space_settings import DEFAULT as DEFAULT_SPACE_SETTINGS
from service.policy.space_settings import SpaceSettings
from service.policy.space_settings import stored as stored_space_settings

_UUID_ARRAY = ARRAY(UUID)
Built = TypeVar("Built")


class Action(StrEnum):
    READ = "read"
    WRITE = "write"
    DELETE = "delete"
    REVIEW = "review"
    """Approve or reject the proposals of a space, and see them (docs/concepts.md, "Review")."""


VISIBLE_MARK = "/* memgate:visible */"
"""A SQL comment every statement Visible builds carries, once per memory row source it reads
(a prefix of its SELECT, UPDATE or DELETE). It is compiled into the cached statement and the
server skips it, so it costs nothing; the test harness fails any statement that reads the
memory table more times than it carries the mark (tests/fixtures/entrance.py)."""


class _Versions(StrEnum):
    CURRENT = "current"
    ALL = "all"


@dataclass(frozen=True)
class Moment:
    """A time-travelling read: `as_of` (valid time, "what was true then") and/or `known_at`
    (record time, "what did we hold then"). Both must carry a time zone."""

    as_of: datetime | None = None
    known_at: datetime | None = None

    def __post_init__(self) -> None:
        for at in (self.as_of, self.known_at):
            if at is not None:
                _aware(at)

    @property
    def is_now(self) -> bool:
        return self.as_of is None and self.known_at is None


@dataclass(frozen=True)
class Liveness:
    """Which versions of a memory a statement sees, as one value (the row's space and audience
    are Visible's other half). Build it with a constructor:

    - `live()`: the current version: not superseded (`superseded_at IS NULL`).
    - `any_version()`: every version of the chain, superseded ones included.
    - `as_of(t)`: valid time, "what was true at t": `valid_from <= t` and (`valid_until IS
      NULL` or `t < valid_until`). Supersession sets `valid_until` to where the successor's
      validity begins, so a chain answers at most one version per key for any `t`.
    - `known_at(t)`: record time, "what did we hold at t": `recorded_at <= t` and
      (`superseded_at IS NULL` or `t < superseded_at`).
    - `.at(Moment(as_of=a, known_at=k))` on `live()`: both ("what did we believe at k about
      a"): recorded by k, and valid at a in the interval as it stood at k (a version closed
      after k was still open-ended then). On `any_version()`: every version that existed by
      then (recorded by k, valid from a or earlier), for walks over a whole chain.
    - `including_revoked()`: every version, revoked ones too (reinstate must find its row).

    Whatever the variant, a revoked row (`revoked_at IS NOT NULL`) is left out unless the value
    came from `including_revoked()` (promise 7), a retracted stub (`retracted_at`: DELETE kept
    its number, not its content) unless `.with_retracted()` says so (history, and the write
    path's numbering), and a row past its TTL (`expires_at <= now()`) unless `.with_expired()`
    says otherwise: expiry and retraction are judged now, not at `t`, because they take a
    memory out of every read at once. `with_expired()` is for the write path's bookkeeping
    (the next version continues an expired chain), not for readers."""

    versions: _Versions
    moment: Moment | None = None
    expired: bool = False
    """Rows past `expires_at` are included."""
    revoked: bool = False
    """Rows with `revoked_at` set are included."""
    retracted: bool = False
    """Retracted stubs (`retracted_at` set) are included."""

    @classmethod
    def live(cls) -> Liveness:
        return cls(_Versions.CURRENT)

    @classmethod
    def any_version(cls) -> Liveness:
        return cls(_Versions.ALL)

    @classmethod
    def including_revoked(cls) -> Liveness:
        return cls(_Versions.ALL, revoked=True)

    @classmethod
    def as_of(cls, at: datetime) -> Liveness:
        return cls.live().at(Moment(as_of=at))

    @classmethod
    def known_at(cls, at: datetime) -> Liveness:
        return cls.live().at(Moment(known_at=at))

    def at(self, moment: Moment | None) -> Liveness:
        """The same versions, seen at `moment` (None or an empty moment: now)."""
        return replace(self, moment=None if moment is None or moment.is_now else moment)

    def with_expired(self) -> Liveness:
        return replace(self, expired=True)

    def with_retracted(self) -> Liveness:
        return replace(self, retracted=True)

    def conditions(self, rows: Any) -> list[ColumnElement[bool]]:
        """The SQL for this value over `rows` (anything with the memory columns as attributes:
        the mapped class, an ORM alias, or a FromClause's `.c`)."""
        conditions: list[ColumnElement[bool]] = []
        if not self.revoked:
            conditions.append(rows.revoked_at.is_(None))
        if not self.retracted:
            conditions.append(rows.retracted_at.is_(None))
        if not self.expired:
            conditions.append(or_(rows.expires_at.is_(None), rows.expires_at > func.now()))
        if self.moment is None:
            if self.versions is _Versions.CURRENT:
                conditions.append(rows.superseded_at.is_(None))
            return conditions
        return conditions + self._then(rows, self.moment)

    def _then(self, rows: Any, moment: Moment) -> list[ColumnElement[bool]]:
        known, valid = moment.known_at, moment.as_of
        conditions: list[ColumnElement[bool]] = []
        if known is not None:
            conditions.append(rows.recorded_at <= known)
        if valid is not None:
            conditions.append(rows.valid_from <= valid)
        if self.versions is _Versions.ALL:
            return conditions
        if valid is None:
            # Current at `known`: not yet closed then.
            conditions.append(or_(rows.superseded_at.is_(None), rows.superseded_at > known))
            return conditions
        still_open = [rows.valid_until.is_(None), rows.valid_until > valid]
        if known is not None:
            # Closed after `known`: its validity was still open-ended then.
            still_open.append(rows.superseded_at > known)
        conditions.append(or_(*still_open))
        return conditions


def _aware(at: datetime) -> datetime:
    # A naive time would be read in the session's time zone: refuse the ambiguity.
    if at.tzinfo is None or at.utcoffset() is None:
        raise ValueError("a liveness time must carry its time zone")
    return at


LIVE = Liveness.live()

MemoryRows = FromClause | AliasedClass[Memory] | type[Memory]
"""Where a predicate reads the memory columns from: the mapped class (the default), an alias
of it, or a FromClause holding the memory columns (a table alias, a CTE of memory rows)."""


def _columns(rows: MemoryRows) -> Any:
    return rows.c if isinstance(rows, FromClause) else rows


@dataclass(frozen=True)
class Visible:
    tenant_id: uuid.UUID
    action: Action
    fixed: ColumnElement[Any] | None = None
    """A fixed `uuid[]` of spaces (`of_spaces`) instead of the caller's grants."""
    moment: Moment | None = None
    """A time-travelling read (`at`): every liveness this predicate builds is seen then."""
    caller: Principal | None = None
    """Whose grants `allowed` reads (None: the `fixed` spaces): its ids are the named
    parameters of every statement built from this predicate (`bound_values`)."""

    @cached_property
    def allowed(self) -> ColumnElement[Any]:
        """A `uuid[]` SQL expression: the spaces the caller holds `action` on. Built when a
        statement first needs it: a statement built once per shape never does."""
        if self.caller is None:
            if self.fixed is None:
                raise TypeError("a Visible names a caller or a fixed set of spaces")
            return self.fixed
        return _granted_array(self.caller, self.action)

    @cached_property
    def readable(self) -> ColumnElement[Any] | None:
        """For writes and deletes: the spaces the caller reads. A row is touched only where the
        caller can also read it, `read_requires` included (None: `allowed` is the read set)."""
        if self.caller is None or self.action is Action.READ:
            return None
        return _granted_array(self.caller, Action.READ)

    @property
    def tenant(self) -> ColumnElement[uuid.UUID]:
        """The tenant as the statement's named parameter (`bound_values`), so a statement built
        once for a shape is run for any caller with that caller's values."""
        return bindparam(f"visible_tenant_{self.action.value}", self.tenant_id, type_=UUID)

    def at(self, moment: Moment | None) -> Visible:
        """This predicate seen at `moment`: every statement built from it (search, list,
        counts, get, history) inherits the time condition. None or an empty moment: now."""
        return replace(self, moment=None if moment is None or moment.is_now else moment)

    @classmethod
    def of_spaces(
        cls, tenant_id: uuid.UUID, action: Action, space_ids: Sequence[uuid.UUID]
    ) -> Visible:
        """A fixed set of spaces (benchmarks, and jobs that snapshot their grants)."""
        return cls(
            tenant_id, action, fixed=cast(literal(list(space_ids), _UUID_ARRAY), _UUID_ARRAY)
        )

    def clause(self, liveness: Liveness = LIVE, *, on: MemoryRows = Memory) -> ColumnElement[bool]:
        """The predicate over `on`'s columns. Only for statements `select` builds (it marks
        them): a bare clause in a hand-made statement reads rows the harness cannot tell from
        a bypass."""
        rows = _columns(on)
        if self.moment is not None and liveness.moment is None:
            liveness = liveness.at(self.moment)
        readable = self.allowed if self.readable is None else self.readable
        conditions: list[ColumnElement[bool]] = [
            rows.tenant_id == self.tenant,
            rows.space_id == any_(self.allowed),
            rows.read_requires.contained_by(readable),
        ]
        if self.readable is not None:
            conditions.append(rows.space_id == any_(readable))
        return and_(*conditions, self._reviewed(rows), *liveness.conditions(rows))

    def _reviewed(self, rows: Any) -> ColumnElement[bool]:
        """The review clause (docs/concepts.md, "Review"): an ordinary row, or a proposal the
        caller wrote or may review. A rejected row (a tombstone) reaches no one; neither does a
        proposal reach a job run or a fixed set of spaces (jobs never see proposals)."""
        ordinary: ColumnElement[bool] = rows.review_state.is_(None)
        if self.caller is None or self.caller.within is not None:
            return ordinary
        me = _bound_ids(self.caller, self.action)["principal"]
        return or_(
            ordinary,
            and_(
                rows.review_state == literal("proposed"),
                or_(rows.writer_id == me, rows.space_id == any_(self.reviewable)),
            ),
        )

    @cached_property
    def reviewable(self) -> ColumnElement[Any]:
        """A `uuid[]`: the spaces whose proposals the caller may see and decide on."""
        if self.caller is None:
            return cast(literal([], _UUID_ARRAY), _UUID_ARRAY)
        return _granted_array(self.caller, Action.REVIEW)

    def select(
        self, *columns: Any, liveness: Liveness = LIVE, on: MemoryRows | None = None
    ) -> Select[Any]:
        """`SELECT columns FROM on WHERE <predicate>`, marked. `on` (an alias or CTE) binds the
        predicate to that row source, so a recursive walk checks every hop; it becomes the
        statement's first FROM item."""
        statement = sa_select(*columns).prefix_with(VISIBLE_MARK)
        if on is None:
            return statement.where(self.clause(liveness))
        return statement.select_from(on).where(self.clause(liveness, on=on))

    def update(self, *, liveness: Liveness = LIVE) -> Update:
        return sa_update(Memory).prefix_with(VISIBLE_MARK).where(self.clause(liveness))

    def delete(self, *, liveness: Liveness | None = None) -> Delete:
        """Any version may be deleted (not an expired or revoked one)."""
        chosen = Liveness.any_version() if liveness is None else liveness
        return delete(Memory).prefix_with(VISIBLE_MARK).where(self.clause(chosen))


def live_rows_up_to(
    scope: Visible, limit: int | ColumnElement[int], *conditions: ColumnElement[bool]
) -> ScalarSelect[int]:
    """How many live rows (neither superseded nor revoked) lie in the spaces `scope` allows and
    match `conditions`, counted no further than `limit`: an upper bound of the rows the caller
    sees, read from the narrow index `ix_memories_visible_count` without testing each row's
    `read_requires` or expiry (that per-row test is most of what counting the visible rows
    costs). For choosing a search path only; never a number anyone is shown or refused by."""
    # Marked: it is built here, in the entrance, and only the count leaves it (no row does).
    capped = (
        sa_select(literal(1))
        .prefix_with(VISIBLE_MARK)
        .where(
            Memory.tenant_id == scope.tenant,
            Memory.space_id == any_(scope.allowed),
            Memory.superseded_at.is_(None),
            Memory.revoked_at.is_(None),
            *conditions,
        )
        .limit(limit)
        .subquery()
    )
    return sa_select(func.count()).select_from(capped).scalar_subquery()


def visible(principal: Principal, action: Action) -> Visible:
    """The predicate of `principal`'s `action`; its SQL is built when a statement needs it."""
    with span("policy.visible", {"memgate.policy.action": action.value}):
        return Visible(principal.tenant_id, action, caller=principal)


def _granted_array(principal: Principal, action: Action) -> ColumnElement[Any]:
    """The granted spaces as one `uuid[]`, computed once per statement: a CTE (hoisted to the
    statement's top), so a search whose legs, gates and recheck each test the predicate reads
    the grants once, instead of planning and running one subquery per use."""
    granted = _granted_spaces(principal, action).subquery()
    spaces = (
        sa_select(
            func.coalesce(func.array_agg(granted.c.id), literal([], _UUID_ARRAY)).label("ids")
        )
        .select_from(granted)
        .cte(f"{action.value}_spaces")
    )
    # The cast makes `= ANY(...)` take the array value, not the subquery's rows.
    return cast(sa_select(spaces.c.ids).scalar_subquery(), _UUID_ARRAY)


async def granted_space_ids(
    session: AsyncSession, principal: Principal, action: Action
) -> list[uuid.UUID]:
    """The same grants as a list, for choosing where a write goes (not for reading rows)."""
    return list((await session.scalars(_granted_spaces(principal, action))).all())


def _granted_spaces(principal: Principal, action: Action) -> Select[uuid.UUID]:
    """The compiled grants (service/policy/compile.py), read in the statement's snapshot. A
    delegated call gets the spaces both the user and the acting agent hold `action` on; a job
    run those its principal holds now and held at enqueue (`Principal.within`).

    The caller's ids are the named parameters `bound_values` lists, so a statement built once
    per shape (`bound_values` of a template caller) runs for any caller of that shape."""
    ids = _bound_ids(principal, action)
    granted = sa_select(SpaceGrant.space_id.label("id")).where(
        SpaceGrant.tenant_id == ids["tenant"],
        SpaceGrant.principal_id == ids["principal"],
        SpaceGrant.action == action.value,
    )
    if action is Action.REVIEW:
        granted = granted.where(_may_review(principal))
    if principal.within is not None:
        # A job run: the grants now, inside those held at enqueue. `read_requires` is tested
        # against the read set built here, so a row needing a space outside the snapshot is
        # not visible either.
        held = list(principal.within.spaces(action.value))
        snapshot = bindparam(f"visible_within_{action.value}", held, type_=_UUID_ARRAY)
        granted = granted.where(SpaceGrant.space_id == any_(cast(snapshot, _UUID_ARRAY)))
    if principal.actor_id is None:
        return granted
    actor = aliased(SpaceGrant)
    return granted.where(
        sa_select(actor.space_id)
        .where(
            actor.tenant_id == ids["tenant"],
            actor.principal_id == ids["actor"],
            actor.action == action.value,
            actor.space_id == SpaceGrant.space_id,
        )
        .exists()
    )


def may_review(principal: Principal) -> bool:
    """Whether this call may exercise a `review` grant at all: its token carries
    `review:memory`, its principal is no agent (the entrance read its kind), and it is no
    agent acting for a user (a delegated token), nor a job run. Agents never review: a
    delegated agent's writes into a reviewed space stay proposals, whatever the user it acts
    for may do."""
    return (
        principal.has_scope(Scope.REVIEW_MEMORY)
        and not principal.agent
        and principal.actor_id is None
        and principal.within is None
    )


def _may_review(principal: Principal) -> ColumnElement[bool]:
    """The review grant counts only for a call `may_review` lets: a named parameter, so the
    statement's shape does not depend on it (and PostgreSQL, planning with the value, drops
    the review grants' subquery for every other caller)."""
    return bindparam("visible_may_review", may_review(principal), type_=Boolean)


def _bound_ids(principal: Principal, action: Action) -> dict[str, ColumnElement[uuid.UUID]]:
    """The caller's ids as named parameters, one set per action: a statement holding two
    actions' predicates (a write's write and read sets) names each set apart."""
    ids = {"tenant": principal.tenant_id, "principal": principal.principal_id}
    if principal.actor_id is not None:
        ids["actor"] = principal.actor_id
    return {
        name: bindparam(f"visible_{name}_{action.value}", value, type_=UUID)
        for name, value in ids.items()
    }


VisibleShape = tuple[bool, bool]
"""What a statement built from `visible(principal, …)` depends on besides the values
`bound_values` names: whether the caller is delegated, and whether it is a job run's snapshot."""


def shape_of(principal: Principal) -> VisibleShape:
    return (principal.actor_id is not None, principal.within is not None)


def template_caller(principal: Principal) -> Principal:
    """A caller of `principal`'s shape with placeholder ids that match no row: a statement is
    built once from it and run with a real caller's `bound_values`."""
    nobody = uuid.UUID(int=0)
    return Principal(
        tenant_id=nobody,
        principal_id=nobody,
        client_id="",
        scopes=frozenset(),
        token_id="",
        issuer="",
        actor_id=None if principal.actor_id is None else nobody,
        within=None if principal.within is None else GrantSnapshot.of({}),
    )


def bound_values(principal: Principal) -> dict[str, Any]:
    """The caller's values of the named parameters a `Visible` statement carries: a statement
    built once for `shape_of(principal)` runs for this caller with these parameters. Two
    callers' predicates never share a statement (their grant CTEs would carry one name)."""
    values: dict[str, Any] = {"visible_may_review": may_review(principal)}
    for action in Action:
        values[f"visible_tenant_{action.value}"] = principal.tenant_id
        values[f"visible_principal_{action.value}"] = principal.principal_id
        if principal.actor_id is not None:
            values[f"visible_actor_{action.value}"] = principal.actor_id
        if principal.within is not None:
            values[f"visible_within_{action.value}"] = list(principal.within.spaces(action.value))
    return values


class PerShape(Generic[Built]):
    """Statements built once per shape of caller (and whatever else `build` is told), then run
    with each caller's `bound_values` and the request's own named parameters: building and
    hashing a statement of CTEs costs the server more CPU than PostgreSQL spends running it,
    and a statement object reused keeps its memoized cache key. `build(scope, *shape)` must
    make every request value a named parameter (placeholders that match nothing), so a value
    left out runs as its placeholder, never as another caller's. A predicate of fixed spaces
    or a time-travelling one is built per request (its values are literals)."""

    def __init__(self, build: Callable[..., Built]) -> None:
        self._build = build
        self._built: dict[tuple[Any, ...], Built] = {}

    def __call__(self, scope: Visible, *shape: Hashable) -> tuple[Built, dict[str, Any]]:
        """The statement for `scope` and the caller's values of its named parameters."""
        if scope.caller is None or scope.moment is not None:
            return self._build(scope, *shape), {}
        key = (shape_of(scope.caller), scope.action, *shape)
        built = self._built.get(key)
        if built is None:
            template = visible(template_caller(scope.caller), scope.action)
            built = self._built[key] = built_once(self._build(template, *shape))
        return built, bound_values(scope.caller)


@dataclass(frozen=True)
class WriteTargets:
    """Where a caller may put a memory: the spaces it reads, those it writes (a writer must
    read too, so `writable` holds only readable spaces), its personal space, if any, and the
    settings (gates) of the writable spaces that have any."""

    readable: frozenset[uuid.UUID]
    writable: tuple[uuid.UUID, ...]
    personal: uuid.UUID | None
    settings: dict[uuid.UUID, SpaceSettings] = field(default_factory=dict)
    reviewable: frozenset[uuid.UUID] = frozenset()
    """The spaces whose reviewers the caller counts among (`may_review` and a `review` grant):
    its writes there are never proposals."""

    def proposes(self, space_id: uuid.UUID) -> bool:
        """A write into `space_id` lands as a proposal: the space is reviewed and the writer
        is none of its reviewers."""
        return self.settings_of(space_id).review and space_id not in self.reviewable

    def settings_of(self, space_id: uuid.UUID) -> SpaceSettings:
        return self.settings.get(space_id, DEFAULT_SPACE_SETTINGS)


async def write_targets(session: AsyncSession, principal: Principal) -> WriteTargets:
    """`granted_space_ids` for read and for write, `personal_space_id` and the writable
    spaces' settings, in one statement (one snapshot, one round trip): the question "where may
    this caller write, and under which gates?" asked once."""
    statement, params = _WRITE_TARGETS(visible(principal, Action.WRITE))
    (row,) = await run(session, statement, params)
    reads = frozenset(row[0])
    settings = {uuid.UUID(key): stored_space_settings(raw) for key, raw in (row[3] or {}).items()}
    writes = tuple(s for s in row[1] if s in reads)
    return WriteTargets(reads, writes, row[2], settings, frozenset(row[4]) & reads)


def _build_write_targets(scope: Visible) -> Select[Any]:
    principal = scope.caller
    assert principal is not None  # PerShape builds it from a caller's template
    writable = _granted_array(principal, Action.WRITE)
    return sa_select(
        _granted_array(principal, Action.READ),
        writable,
        _personal_space(principal).scalar_subquery(),
        _space_settings(principal, writable),
        _granted_array(principal, Action.REVIEW),
    )


_WRITE_TARGETS = PerShape(_build_write_targets)


def _space_settings(principal: Principal, spaces: ColumnElement[Any]) -> ScalarSelect[Any]:
    """`{space id: settings}` of the given spaces whose settings are not all defaults."""
    return (
        sa_select(func.jsonb_object_agg(cast(Space.id, Text), Space.settings))
        .where(
            Space.tenant_id == _bound_ids(principal, Action.WRITE)["tenant"],
            Space.id == any_(spaces),
            Space.settings != literal({}, JSONB),
        )
        .scalar_subquery()
    )


def _personal_space(principal: Principal) -> Select[uuid.UUID]:
    ids = _bound_ids(principal, Action.WRITE)
    return sa_select(Space.id).where(
        Space.tenant_id == ids["tenant"],
        Space.owner_id == ids["principal"],
        Space.kind == "personal",
    )


async def personal_space_id(session: AsyncSession, principal: Principal) -> uuid.UUID | None:
    """The caller's own space (where writes go unless they name another)."""
    found: uuid.UUID | None = await session.scalar(_personal_space(principal))
    return found
