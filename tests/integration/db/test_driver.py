"""Hot statements on the driver (service/db/driver.py): the rows, types, listeners and errors a
statement has through SQLAlchemy, without its execution path."""

from __future__ import annotations

import datetime
import uuid
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import (
    Float,
    Integer,
    Numeric,
    Text,
    bindparam,
    cast,
    event,
    func,
    literal,
    select,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID
from sqlalchemy.exc import DBAPIError, ProgrammingError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from service.db.driver import DriverStatement
from service.db.session import create_engine
from tests.fixtures.entrance import caught_unmarked

TYPED = select(
    cast(bindparam("ratio", type_=Text), Float).label("ratio"),
    cast(bindparam("amount", type_=Text), Numeric(10, 2)).label("amount"),
    cast(bindparam("ids", type_=ARRAY(UUID)), ARRAY(UUID)).label("ids"),
    cast(bindparam("doc", type_=JSONB), JSONB).label("doc"),
    func.now().label("at"),
    literal("fixed").label("constant"),
)
PARAMS = {
    "ratio": "0.25",
    "amount": "12.50",
    "ids": [uuid.UUID(int=7), uuid.UUID(int=8)],
    "doc": {"a": [1, 2], "b": None},
}


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_engine(database_url, pool_size=1)
    try:
        yield engine
    finally:
        await engine.dispose()


@pytest.fixture
async def session(engine: AsyncEngine) -> AsyncIterator[AsyncSession]:
    async with async_sessionmaker(engine)() as session:
        yield session
        await session.rollback()


async def test_rows_read_as_sqlalchemy_reads_them(session: AsyncSession) -> None:
    expected = (await session.execute(TYPED, PARAMS)).one()
    (row,) = await DriverStatement(TYPED).rows(session, PARAMS)
    assert tuple(row) == tuple(expected)
    assert row.ratio == 0.25
    assert type(row.ratio) is float
    assert row.amount == Decimal("12.50")
    assert row.ids == [uuid.UUID(int=7), uuid.UUID(int=8)]
    assert row.doc == {"a": [1, 2], "b": None}
    assert isinstance(row.at, datetime.datetime)
    assert row.at.tzinfo is not None
    assert row.constant == "fixed"  # a value the statement was built with


async def test_rows_are_named_by_the_columns_keys(session: AsyncSession) -> None:
    """A select's rows are named as SQLAlchemy names them (a column's key, not its SQL
    label); a text's by what the database answers."""
    keyed = select(literal(1).label("n")).subquery()
    statement = select(keyed.c.n.label("total"), literal(2, Integer).label("two"))
    (row,) = await DriverStatement(statement).rows(session, {})
    assert row._fields == ("total", "two")
    assert row.total == 1
    (row,) = await DriverStatement(text("SELECT 3 AS three, 4 AS four")).rows(session, {})
    assert (row.three, row.four) == (3, 4)


async def test_a_statement_runs_in_the_sessions_transaction(session: AsyncSession) -> None:
    await session.execute(text("SELECT set_config('memgate.probe', 'named', true)"))
    probe = DriverStatement(text("SELECT current_setting('memgate.probe', true) AS probe"))
    assert (await probe.rows(session, {}))[0].probe == "named"
    await session.rollback()  # transaction-local: the next transaction does not see it
    assert (await probe.rows(session, {}))[0].probe in (None, "")


async def test_cursor_listeners_see_each_statement(
    engine: AsyncEngine, session: AsyncSession
) -> None:
    """The engine's listeners (the suite's Visible check, statement counters, SQL spans) see a
    statement on the driver as they see any other."""
    seen: list[tuple[str, str, Any]] = []
    sync = engine.sync_engine

    def before(_c: Any, _cursor: Any, statement: str, params: Any, *_: Any) -> None:
        seen.append(("before", statement, params))

    def after(_c: Any, _cursor: Any, statement: str, *_: Any) -> None:
        seen.append(("after", statement, None))

    event.listen(sync, "before_cursor_execute", before)
    event.listen(sync, "after_cursor_execute", after)
    try:
        await DriverStatement(text("SELECT :n AS n")).rows(session, {"n": 5})
    finally:
        event.remove(sync, "before_cursor_execute", before)
        event.remove(sync, "after_cursor_execute", after)
    assert seen == [("before", "SELECT %(n)s AS n", {"n": 5}), ("after", "SELECT %(n)s AS n", None)]


async def test_the_visible_check_catches_an_unmarked_read_on_the_driver(
    session: AsyncSession,
) -> None:
    with caught_unmarked() as caught:
        await DriverStatement(text("SELECT count(*) FROM memories")).rows(session, {})
    assert len(caught) == 1


async def test_a_driver_error_is_sqlalchemys_with_the_values_hidden(session: AsyncSession) -> None:
    statement = DriverStatement(select(cast(bindparam("v", type_=Text), Integer).label("v")))
    with pytest.raises(DBAPIError) as raised:
        await statement.rows(session, {"v": "not a number"})
    assert getattr(raised.value.orig, "sqlstate", None) == "22P02"
    assert "parameters hidden" in str(raised.value)
    assert "'not a number'" not in str(raised.value).split("[SQL:")[1]


async def test_a_value_left_out_of_a_text_fails_loudly(session: AsyncSession) -> None:
    with pytest.raises(ProgrammingError):
        await DriverStatement(text("SELECT :required AS r")).rows(session, {})


async def test_expanding_parameters_are_refused(session: AsyncSession) -> None:
    statement = select(literal(1)).where(literal(1).in_(bindparam("xs", expanding=True)))
    with pytest.raises(TypeError, match="expanding"):
        await DriverStatement(statement).rows(session, {"xs": [1]})
