"""Promise 2 in SQL (tests/fixtures/entrance.py), `Liveness`, and Visible bound to an alias.

Every bypass shape the architecture review planted (§c, H2) is sent for real, as the app role
with a caller named, and the harness's statement check stops each one before it runs. The
liveness variants are checked row by row on a small dataset with fixed times, and a recursive
history walk applies the predicate at every hop.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from sqlalchemy import Text, delete, func, select, text, update
from sqlalchemy.dialects.postgresql import UUID
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import (
    DeclarativeBase,
    Mapped,
    aliased,
    foreign,
    mapped_column,
    relationship,
    selectinload,
)

from service.auth.principal import Principal
from service.db.models import Memory, Space
from service.policy.visible import Action, Liveness, visible
from tests.fixtures.api import Agent, Api
from tests.fixtures.entrance import bypasses_visible, caught_unmarked, unmarked_sources

_NAME_CALLER = text(
    "SELECT set_config('memgate.tenant_id', :tenant, true), "
    "set_config('memgate.principal_id', :principal, true)"
)
_SQL = "SELECT value FROM memories"
"""A statement held in a constant, as the review planted it."""


class _Scratch(DeclarativeBase):
    """A second mapping of the memory table with a relationship, as a careless model would add."""


class _ScratchMemory(_Scratch):
    __tablename__ = "memories"
    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID, primary_key=True)
    id: Mapped[uuid.UUID] = mapped_column(UUID, primary_key=True)
    space_id: Mapped[uuid.UUID] = mapped_column(UUID)
    value: Mapped[str] = mapped_column(Text)


class _ScratchSpace(_Scratch):
    __tablename__ = "spaces"
    tenant_id: Mapped[uuid.UUID] = mapped_column(UUID, primary_key=True)
    id: Mapped[uuid.UUID] = mapped_column(UUID, primary_key=True)
    memories: Mapped[list[_ScratchMemory]] = relationship(
        primaryjoin=lambda: (
            (_ScratchSpace.tenant_id == foreign(_ScratchMemory.tenant_id))
            & (_ScratchSpace.id == foreign(_ScratchMemory.space_id))
        ),
        viewonly=True,
    )


def _caller(api: Api, agent: Agent) -> Principal:
    return Principal(
        tenant_id=uuid.UUID(api.tenant_id),
        principal_id=uuid.UUID(agent.principal_id),
        client_id=agent.client_id,
        scopes=frozenset({"read:memory"}),
        token_id="test",
        issuer="test",
    )


@asynccontextmanager
async def _as_caller(api: Api, caller: Principal) -> AsyncIterator[AsyncSession]:
    """A transaction as the app role with `caller` named for row-level security (rolled back)."""
    async with api.runtime.sessionmaker() as session, session.begin():
        await session.execute(
            _NAME_CALLER, {"tenant": str(caller.tenant_id), "principal": str(caller.principal_id)}
        )
        yield session
        await session.rollback()


@dataclass(frozen=True)
class Planted:
    """What a planted bypass works with: the caller, its memory and the database URL."""

    caller: Principal
    memory_id: uuid.UUID
    url: str


Bypass = Callable[[AsyncSession, Planted], Awaitable[Any]]


async def _count_select_from(s: AsyncSession, at: Planted) -> Any:
    return await s.scalar(select(func.count()).select_from(Memory))


async def _count_where_only(s: AsyncSession, at: Planted) -> Any:
    return await s.scalar(select(func.count()).where(Memory.tenant_id == at.caller.tenant_id))


async def _aliased(s: AsyncSession, at: Planted) -> Any:
    row = aliased(Memory)
    return (await s.scalars(select(row.value).where(row.id == at.memory_id))).all()


async def _table_select(s: AsyncSession, at: Planted) -> Any:
    return (await s.execute(Memory.__table__.select())).all()


async def _text_constant(s: AsyncSession, at: Planted) -> Any:
    return (await s.execute(text(_SQL))).all()


async def _driver_sql(s: AsyncSession, at: Planted) -> Any:
    return (await (await s.connection()).exec_driver_sql(_SQL)).all()


async def _raw_psycopg(s: AsyncSession, at: Planted) -> Any:
    with psycopg.connect(at.url) as conn:
        return conn.execute(_SQL).fetchall()


async def _update(s: AsyncSession, at: Planted) -> Any:
    return await s.execute(update(Memory).values(value="overwritten"))


async def _delete(s: AsyncSession, at: Planted) -> Any:
    return await s.execute(delete(Memory).where(Memory.id == at.memory_id))


async def _join(s: AsyncSession, at: Planted) -> Any:
    statement = select(Space.name, Memory.value).join(Memory, Memory.space_id == Space.id)
    return (await s.execute(statement)).all()


async def _subquery(s: AsyncSession, at: Planted) -> Any:
    inner = select(Memory.space_id).where(Memory.value.like("%secret%"))
    return (await s.scalars(select(Space.id).where(Space.id.in_(inner)))).all()


async def _cte(s: AsyncSession, at: Planted) -> Any:
    rows = select(Memory.id, Memory.value).cte("rows")
    return (await s.execute(select(rows.c.value))).all()


async def _relationship(s: AsyncSession, at: Planted) -> Any:
    spaces = await s.scalars(select(_ScratchSpace).options(selectinload(_ScratchSpace.memories)))
    return [m.value for space in spaces.all() for m in space.memories]


async def _session_get(s: AsyncSession, at: Planted) -> Any:
    return await s.get(Memory, (at.caller.tenant_id, at.memory_id))


async def _alias_onto_visible(s: AsyncSession, at: Planted) -> Any:
    """A marked Visible select with one more, unmarked, memory source joined on."""
    caller_scope = visible(at.caller, Action.READ)
    other = aliased(Memory)
    statement = caller_scope.select(Memory.id, other.value).join(
        other, other.tenant_id == Memory.tenant_id
    )
    return (await s.execute(statement)).all()


BYPASSES: dict[str, Bypass] = {
    "count-select-from": _count_select_from,
    "count-from-where": _count_where_only,
    "aliased": _aliased,
    "table-select": _table_select,
    "text-constant": _text_constant,
    "exec-driver-sql": _driver_sql,
    "raw-psycopg": _raw_psycopg,
    "update": _update,
    "delete": _delete,
    "join": _join,
    "subquery": _subquery,
    "cte": _cte,
    "relationship-load": _relationship,
    "session-get": _session_get,
    "alias-joined-onto-visible": _alias_onto_visible,
}


@pytest.mark.parametrize("shape", list(BYPASSES))
async def test_every_bypass_shape_is_stopped_before_it_runs(api: Api, shape: str) -> None:
    alice = await api.new_agent("alice")
    written = await api.remember(alice, key="secret", value="the secret plan")
    caller = _caller(api, alice)
    reached = False
    async with _as_caller(api, caller) as session:
        with caught_unmarked() as caught:
            planted = Planted(caller, uuid.UUID(written["id"]), api.runtime.settings.database.url)
            await BYPASSES[shape](session, planted)
            reached = True
    assert not reached, "the statement ran"
    assert len(caught) == 1
    assert unmarked_sources(caught[0].statement) >= 1
    assert "bypasses_visible" in str(caught[0])
    # Nothing was sent: the row is as written.
    listed = await api.http.get("/v1/memories", headers=alice.headers)
    assert [(m["id"], m["value"]) for m in listed.json()["items"]] == [
        (written["id"], "the secret plan")
    ]


async def test_a_named_bypass_lets_a_deliberate_read_through(api: Api) -> None:
    alice = await api.new_agent("alice")
    await api.remember(alice, key="secret", value="the secret plan")
    async with _as_caller(api, _caller(api, alice)) as session:
        with bypasses_visible("row-level security alone, in this test"):
            values = (await session.scalars(text(_SQL))).all()
    assert values == ["the secret plan"]


T1 = datetime(2026, 1, 1, tzinfo=UTC)
T2 = datetime(2026, 2, 1, tzinfo=UTC)
T3 = datetime(2026, 3, 1, tzinfo=UTC)
DAY = timedelta(days=1)


async def _dataset(api: Api, owner_engine: AsyncEngine) -> tuple[Agent, dict[str, str]]:
    """A chain of three versions (v1 valid and recorded T1..T2, v2 T2..T3, v3 since T3), a fact
    recorded at T3 about validity since T1 ("late"), an expired row and a revoked row (both
    valid and recorded since T1)."""
    alice = await api.new_agent("alice")
    ids: dict[str, str] = {}
    for n in (1, 2, 3):
        ids[f"chain.v{n}"] = (await api.remember(alice, key="chain", value=f"v{n}"))["id"]
    for key in ("late", "expired", "revoked"):
        ids[key] = (await api.remember(alice, key=key, value=key))["id"]
    times: dict[str, dict[str, Any]] = {
        "chain.v1": {"valid_from": T1, "valid_until": T2, "recorded_at": T1, "superseded_at": T2},
        "chain.v2": {"valid_from": T2, "valid_until": T3, "recorded_at": T2, "superseded_at": T3},
        "chain.v3": {"valid_from": T3, "recorded_at": T3},
        "late": {"valid_from": T1, "recorded_at": T3},
        "expired": {"valid_from": T1, "recorded_at": T1, "expires_at": func.now() - DAY},
        "revoked": {"valid_from": T1, "recorded_at": T1, "revoked_at": T2},
    }
    with bypasses_visible("fixture dataset: fixed times the API cannot write"):
        async with owner_engine.begin() as conn:
            for name, values in times.items():
                await conn.execute(
                    update(Memory).where(Memory.id == uuid.UUID(ids[name])).values(**values)
                )
    return alice, ids


LIVENESS_CASES: dict[str, tuple[Liveness, set[str]]] = {
    "live": (Liveness.live(), {"chain.v3", "late"}),
    "any-version": (Liveness.any_version(), {"chain.v1", "chain.v2", "chain.v3", "late"}),
    "including-revoked": (
        Liveness.including_revoked(),
        {"chain.v1", "chain.v2", "chain.v3", "late", "revoked"},
    ),
    "live-with-expired": (Liveness.live().with_expired(), {"chain.v3", "late", "expired"}),
    "as-of-t1": (Liveness.as_of(T1 + DAY), {"chain.v1", "late"}),
    "as-of-t2": (Liveness.as_of(T2 + DAY), {"chain.v2", "late"}),
    "as-of-before-anything": (Liveness.as_of(T1 - DAY), set()),
    "known-at-t1": (Liveness.known_at(T1 + DAY), {"chain.v1"}),
    "known-at-t2-boundary": (Liveness.known_at(T2), {"chain.v2"}),
    "known-at-t3": (Liveness.known_at(T3 + DAY), {"chain.v3", "late"}),
    "known-at-before-anything": (Liveness.known_at(T1 - DAY), set()),
}


@pytest.mark.parametrize("case", list(LIVENESS_CASES))
async def test_each_liveness_answers_exactly_its_rows(
    api: Api, owner_engine: AsyncEngine, case: str
) -> None:
    liveness, expected = LIVENESS_CASES[case]
    alice, ids = await _dataset(api, owner_engine)
    names = {memory_id: name for name, memory_id in ids.items()}
    caller = _caller(api, alice)
    async with _as_caller(api, caller) as session:
        found = await session.scalars(
            visible(caller, Action.READ).select(Memory.id, liveness=liveness)
        )
        assert {names[str(i)] for i in found.all()} == expected


async def test_no_grants_is_nothing_in_every_liveness(api: Api, owner_engine: AsyncEngine) -> None:
    _, _ = await _dataset(api, owner_engine)
    mallory = await api.new_agent("mallory")
    caller = _caller(api, mallory)
    async with _as_caller(api, caller) as session:
        for liveness, _ in LIVENESS_CASES.values():
            statement = visible(caller, Action.READ).select(Memory.id, liveness=liveness)
            assert (await session.scalars(statement)).all() == []


def test_a_liveness_time_must_carry_its_zone() -> None:
    with pytest.raises(ValueError, match="time zone"):
        Liveness.as_of(datetime(2026, 1, 1))  # a naive time is the point
    with pytest.raises(ValueError, match="time zone"):
        Liveness.known_at(datetime(2026, 1, 1))


async def _walk(session: AsyncSession, caller: Principal, head: str) -> list[int]:
    """The history of `head`, newest first, through `supersedes` links: a recursive CTE whose
    every hop (a table alias, a FromClause) passes the predicate, so it stops at the first
    version the caller may not see."""
    scope = visible(caller, Action.READ)
    every = Liveness.any_version()
    chain = (
        scope.select(Memory.id, Memory.supersedes, Memory.version, liveness=every)
        .where(Memory.id == uuid.UUID(head))
        .cte("chain", recursive=True)
    )
    hop = Memory.__table__.alias("hop")
    step = scope.select(hop.c.id, hop.c.supersedes, hop.c.version, liveness=every, on=hop).join(
        chain, hop.c.id == chain.c.supersedes
    )
    walk = chain.union_all(step)
    versions = await session.scalars(select(walk.c.version).order_by(walk.c.version.desc()))
    return list(versions.all())


async def test_a_recursive_walk_checks_every_hop(api: Api, owner_engine: AsyncEngine) -> None:
    alice, ids = await _dataset(api, owner_engine)
    caller = _caller(api, alice)
    async with _as_caller(api, caller) as session:
        assert await _walk(session, caller, ids["chain.v3"]) == [3, 2, 1]
        # The live head alone, walked under live(): bound to the alias, the hop sees v2 closed.
        hop = aliased(Memory, name="hop")
        live_only = visible(caller, Action.READ).select(hop.version, on=hop)
        assert (await session.scalars(live_only.where(hop.key == "chain"))).all() == [3]
    with bypasses_visible("test setup: revoke the middle version"):
        async with owner_engine.begin() as conn:
            await conn.execute(
                update(Memory).where(Memory.id == uuid.UUID(ids["chain.v2"])).values(revoked_at=T3)
            )
    async with _as_caller(api, caller) as session:
        # v1 is still visible on its own, but the walk stops at the revoked v2.
        assert await _walk(session, caller, ids["chain.v3"]) == [3]
        assert await _walk(session, caller, ids["chain.v1"]) == [1]
    mallory = _caller(api, await api.new_agent("mallory"))
    async with _as_caller(api, mallory) as session:
        assert await _walk(session, mallory, ids["chain.v3"]) == []
