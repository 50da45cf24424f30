"""Hot statements on the driver (service/db/driver.py): the rows, types, listeners and errors a
statement has through SQLAlchemy, without its execution path."""

from __future__ import annotations

import asyncio
import datetime
import uuid
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import psycopg
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


PID = text("SELECT pg_backend_pid() AS pid")


async def test_a_lost_connection_retires_every_older_one_of_the_pool(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """After a restart or failover every pooled connection is dead: the first statement to
    find out retires the whole pool's older connections, as SQLAlchemy does, so only that
    one call fails (the driver path had retired its own connection only: each call after it
    found the next dead one)."""
    engine = create_engine(database_url, pool_size=3, max_overflow=0, ping_after_idle=60)
    maker = async_sessionmaker(engine)
    try:
        sessions = [maker() for _ in range(3)]
        pids = [(await session.execute(PID)).scalar_one() for session in sessions]
        for session in sessions:
            await session.close()
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as owner:
            for pid in pids:
                await owner.execute("SELECT pg_terminate_backend(%s)", (pid,))
        await asyncio.sleep(0.3)
        outcomes = []
        for _ in range(3):
            async with maker() as session:
                try:
                    await DriverStatement(PID).rows(session, {})
                    outcomes.append("ok")
                except DBAPIError as error:
                    outcomes.append(f"lost={error.connection_invalidated}")
    finally:
        await engine.dispose()
    assert outcomes == ["lost=True", "ok", "ok"]
    assert "MissingGreenlet" not in caplog.text


async def test_a_cancelled_statement_ends_its_span(session: AsyncSession) -> None:
    """A statement cut off by the caller's deadline ends its SQL span (failed), like one the
    database refused: the listener's context is never left holding an open span."""
    ended: list[Any] = []

    class Span:
        def is_recording(self) -> bool:
            return False

        def end(self) -> None:
            ended.append(self)

    connection = await session.connection()
    sync = connection.sync_connection
    assert sync is not None

    def before(_c: Any, _cursor: Any, statement: str, params: Any, context: Any, _m: Any) -> Any:
        context._otel_span = Span()
        return statement, params

    event.listen(sync.engine, "before_cursor_execute", before, retval=True)
    try:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await DriverStatement(text("SELECT pg_sleep(3)")).rows(session, {})
    finally:
        event.remove(sync.engine, "before_cursor_execute", before)
    assert len(ended) == 1


async def test_a_none_value_takes_its_types_processor(session: AsyncSession) -> None:
    """SQLAlchemy runs a bind processor on None too (JSONB's turns None into JSON null)."""
    statement = select(cast(bindparam("doc", type_=JSONB), Text).label("doc"))
    expected = (await session.execute(statement, {"doc": None})).scalar_one()
    (row,) = await DriverStatement(statement).rows(session, {"doc": None})
    assert row.doc == expected == "null"


async def test_only_the_statements_parameters_are_sent(
    engine: AsyncEngine, session: AsyncSession
) -> None:
    """An anonymous bind is sent under its rendered name only."""
    sent: list[Any] = []

    def before(_c: Any, _cursor: Any, _statement: str, params: Any, *_: Any) -> None:
        sent.append(params)

    statement = select(literal(5).label("five"), bindparam("n", 1, Integer).label("n"))
    event.listen(engine.sync_engine, "before_cursor_execute", before)
    try:
        (row,) = await DriverStatement(statement).rows(session, {"n": 2})
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", before)
    assert (row.five, row.n) == (5, 2)
    assert sent == [{"param_1": 5, "n": 2}]
