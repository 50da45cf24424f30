"""Hot statements run on the driver: a statement built once per shape is compiled once, and each
call sends its SQL with the request's values straight to psycopg on the session's connection.

SQLAlchemy's execution path (cache key, parameter construction, execution context, result
metadata, the async bridge) cost about 1.1 ms of server CPU per search statement, more than
psycopg spends sending it (docs/architecture.md, "Statements on the driver"). What the path
did is kept, once per shape or per call:

- the transaction: the statement runs on the session's connection, so it begins the
  session's transaction (and the call's naming hook) like any other statement;
- types: every bind and result processor of the statement's types runs (the vector's text
  form, JSON), found once per shape;
- listeners: `before_cursor_execute` and `after_cursor_execute` of the engine see the
  statement as SQLAlchemy would send it (the test suite's `Visible` check, statement
  counters, the SQL spans); a stand-in context carries the span between them;
- errors: a driver error becomes SQLAlchemy's `DBAPIError` of the same class (parameters
  hidden: they carry memory text), and a lost connection retires the pool's older ones.

Only statements whose every request value is a named parameter qualify (`PerShape`, the fused
search's shapes): a statement with expanding (`IN`) parameters is refused when compiled.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar
from weakref import WeakKeyDictionary

import psycopg
from psycopg import Column
from sqlalchemy.engine import Connection, CursorResult, Dialect
from sqlalchemy.exc import DBAPIError, StatementError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.expression import ClauseElement, Executable
from sqlalchemy.util import greenlet_spawn

from service.observability.telemetry import fail_statement_span

Processor = Callable[[Any], Any]
QUERY_CANCELED = "57014"
"""SQLSTATE of a statement cancelled by `statement_timeout` (a read's budget, or the
connection's MEMGATE_DB_STATEMENT_TIMEOUT_MS)."""
Built = TypeVar("Built")


class _ListenerContext:
    """What a cursor listener may keep between before and after: the SQL span's slot."""

    __slots__ = ("_otel_span",)


class _Compiled:
    def __init__(self, statement: ClauseElement, dialect: Dialect) -> None:
        compiled = statement.compile(dialect=dialect)
        assert isinstance(compiled, SQLCompiler)  # a select or a text, never DDL
        if compiled.post_compile_params or compiled.literal_execute_params:
            raise TypeError("a statement with expanding parameters is compiled per call")
        self.sql = compiled.string
        self.escaped = dict(compiled.escaped_bind_names)
        self.binds: dict[str, Processor | None] = {}
        defaults: dict[str, Any] = {}
        for bind, name in compiled.bind_names.items():  # each under its rendered name only
            self.binds[name] = bind.type.dialect_impl(dialect).bind_processor(dialect)
            if not bind.required:  # a text's `:name` has no value: each call must bring it
                defaults[name] = bind.effective_value
        self.defaults = self._processed(defaults)
        # A select's rows are named by its columns' keys (`metadata_`, not the SQL label
        # `metadata`), as SQLAlchemy's are; a text's by what the driver describes.
        selected = getattr(statement, "selected_columns", None)
        self._types = None if selected is None else [c.type.dialect_impl(dialect) for c in selected]
        self._names = None if selected is None else list(selected.keys())
        self._dialect = dialect
        self._results: list[tuple[int, Processor]] = []
        self._row: Any = None

    def _processed(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The values of the statement's parameters, each in its type's form. Values the
        statement has no parameter for are left out, as SQLAlchemy does (a caller's values
        name every action's predicate; a statement carries some)."""
        processed: dict[str, Any] = {}
        binds = self.binds
        for name, value in values.items():
            if name in binds:
                processor = binds[name]
                # None too: JSONB's processor makes it JSON null, as SQLAlchemy's path does.
                processed[self.escaped.get(name, name)] = (
                    value if processor is None else processor(value)
                )
        return processed

    def values(self, params: Mapping[str, Any]) -> dict[str, Any]:
        return self.defaults | self._processed(params)

    @property
    def learned(self) -> bool:
        return self._row is not None

    def rows(self, raw: list[tuple[Any, ...]], described: Sequence[Column] | None) -> list[Any]:
        if self._row is None:  # names and the driver's types are known from the first answer
            self._learn(described or ())
        make, results = self._row._make, self._results
        if not results:
            return [make(values) for values in raw]
        converted = []
        for values in raw:
            cells = list(values)
            for index, processor in results:
                cells[index] = processor(cells[index])
            converted.append(make(cells))
        return converted

    def _learn(self, described: Sequence[Column]) -> None:
        if self._types is not None:
            for index, (type_, column) in enumerate(zip(self._types, described, strict=True)):
                convert = type_.result_processor(self._dialect, column.type_code)
                if convert is not None:
                    self._results.append((index, convert))
        names = self._names or [column.name for column in described]
        self._row = namedtuple("Row", names, rename=True)  # type: ignore[misc]


class DriverStatement:
    """A statement of one shape, run on the driver with each call's named parameters."""

    def __init__(self, statement: ClauseElement) -> None:
        self.statement = statement
        self._compiled: _Compiled | None = None

    async def rows(self, session: AsyncSession, params: Mapping[str, Any]) -> list[Any]:
        """The statement's rows in the session's transaction (begun by it if need be), with
        attribute access by column name as SQLAlchemy's rows have."""
        connection = (await session.connection()).sync_connection
        assert connection is not None  # an open session's connection has its sync side
        compiled = self._compiled
        if compiled is None:
            compiled = self._compiled = _Compiled(self.statement, connection.dialect)
        values = compiled.values(params)
        rows, described = await _fetch(connection, compiled.sql, values, compiled.learned)
        return compiled.rows(rows, described)


_BUILT_ONCE: WeakKeyDictionary[Executable, DriverStatement] = WeakKeyDictionary()


def built_once(statement: Built) -> Built:
    """Mark a statement (or the statements of a tuple) as built once and reused, so `run`
    sends it on the driver; answers it unchanged."""
    for part in statement if isinstance(statement, tuple) else (statement,):
        if isinstance(part, ClauseElement) and isinstance(part, Executable):
            _BUILT_ONCE[part] = DriverStatement(part)
    return statement


async def run(
    session: AsyncSession, statement: Executable, params: Mapping[str, Any] | None = None
) -> list[Any]:
    """The rows of `statement` (none for a statement that returns none): on the driver when
    it was `built_once`, else through SQLAlchemy (a statement built for one request, whose
    literal values SQLAlchemy's cache sets apart)."""
    driven = _BUILT_ONCE.get(statement)
    if driven is not None:
        return await driven.rows(session, params or {})
    result = await session.execute(statement, params)
    if isinstance(result, CursorResult) and not result.returns_rows:
        return []
    return list(result.all())


async def _fetch(
    connection: Connection, sql: str, values: dict[str, Any], learned: bool
) -> tuple[list[tuple[Any, ...]], list[Column] | None]:
    # The engine's cursor listeners see each statement, the harness's Visible check included.
    driver = connection.connection.driver_connection  # visible: ok listeners see every statement
    assert isinstance(driver, psycopg.AsyncConnection)
    context = _ListenerContext()
    async with driver.cursor() as cursor:
        for listener in connection.dispatch.before_cursor_execute:
            sql, values = listener(connection, cursor, sql, values, context, False)
        try:
            await cursor.execute(sql, values)
            described = cursor.description
            rows = [] if described is None else await cursor.fetchall()
        except BaseException as error:  # a cancelled statement ends its span too
            fail_statement_span(getattr(context, "_otel_span", None), error)
            if not isinstance(error, psycopg.Error):
                raise
            raise await _wrapped(connection, sql, values, error, cursor) from error
        connection.dispatch.after_cursor_execute(connection, cursor, sql, values, context, False)
    return rows, None if learned else described


async def _wrapped(
    connection: Connection,
    sql: str,
    values: dict[str, Any],
    error: psycopg.Error,
    cursor: psycopg.AsyncCursor[Any],
) -> StatementError:
    dialect = connection.dialect
    lost = dialect.is_disconnect(error, connection.connection, cursor)  # type: ignore[arg-type]
    if lost:  # closing a connection is I/O: in SQLAlchemy's greenlet, as its own path does
        await greenlet_spawn(_retire_older_connections, connection, error)
    return DBAPIError.instance(
        sql,
        values,
        error,
        psycopg.Error,
        hide_parameters=True,
        connection_invalidated=lost,
        dialect=dialect,
        ismulti=False,
    )


def _retire_older_connections(connection: Connection, error: BaseException) -> None:
    """What SQLAlchemy does on a lost connection: a restart or failover killed every pooled
    connection made before it, so the pool retires them all (each is replaced at its next
    checkout) and this one is invalidated, instead of each later call finding the next dead
    one. (`Pool._invalidate` is the pool's own step of `Connection._handle_dbapi_exception`.)"""
    connection.engine.pool._invalidate(connection.connection, error)
    connection.invalidate(error)
