"""Engine and session factory. The request (or job run) owns the transaction; services never
commit."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import event, exc
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)


def async_url(url: str) -> str:
    """Accept the usual spellings of a PostgreSQL URL and pin the psycopg 3 driver."""
    for prefix in ("postgresql+psycopg://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    raise ValueError("DATABASE_URL must be a postgresql:// URL")


PING_AFTER_IDLE_SECONDS = 5.0
"""A pooled connection idle longer than this is pinged before it is handed out."""

PREPARE_THRESHOLD = 5
"""Sends of one statement on a connection before psycopg prepares it on the server (psycopg's
own default). A search's statement then costs about 40 % less PostgreSQL CPU: its parse and
plan are not repeated (docs/architecture.md, "Prepared statements")."""

PREPARED_MAX = 32
"""Prepared statements a connection keeps, the least recently used going first. Each holds its
plan in the backend's memory (about 0.3 MB for a search's): psycopg's default of 100, on every
pooled connection of every worker, could approach a gigabyte. A search prepares three; 32 leave
room for the hot statements of every operation."""


def create_engine(
    url: str,
    *,
    pool_size: int = 10,
    role: str | None = None,
    max_overflow: int | None = None,
    ping_after_idle: float = PING_AFTER_IDLE_SECONDS,
    connect_timeout: int | None = None,
    prepared: bool = True,
    statement_timeout_ms: int = 0,
) -> AsyncEngine:
    """The app's engine. With `role`, every new connection switches to that role first, so the
    app works with the non-owner role's privileges whoever it logs in as. The overflow is the
    pool size again unless given. A connection that sat in the pool longer than
    `ping_after_idle` seconds is pinged before use (`_ping_when_idle`). `connect_timeout`
    (seconds) overrides the URL's, for a pool that must fail fast (the read replica's).
    `prepared`: statements sent often are prepared on the server (`PREPARE_THRESHOLD`); off
    for a pooler that cannot carry them (`MEMGATE_DB_PREPARED_STATEMENTS`).
    `statement_timeout_ms`: the connections' `statement_timeout` (0: the server's)."""
    engine = create_async_engine(
        async_url(url),
        pool_size=pool_size,
        max_overflow=pool_size if max_overflow is None else max_overflow,
        connect_args={"prepare_threshold": PREPARE_THRESHOLD if prepared else None}
        | ({} if connect_timeout is None else {"connect_timeout": connect_timeout}),
    )
    _ping_when_idle(engine, ping_after_idle)
    if prepared:
        _bound_prepared_statements(engine)
    if role or statement_timeout_ms:
        _session_defaults_on_connect(engine, role, statement_timeout_ms)
    return engine


def _ping_when_idle(engine: AsyncEngine, after_seconds: float) -> None:
    """Ping only connections that sat idle, instead of `pool_pre_ping` on every checkout: that
    cost a round trip per call (two for a search: its own and its audit group's) on connections
    just used a moment ago. A connection that idled longer than `after_seconds` (a database
    restart, a proxy's idle cut) is pinged and, if dead, replaced before anyone uses it; a
    connection that dies while in use fails that statement, and SQLAlchemy then discards every
    connection of the pool older than the failure, so the next calls get fresh ones."""
    pool = engine.sync_engine.pool
    dialect = engine.sync_engine.dialect

    @event.listens_for(pool, "checkin")
    def idle_from(_dbapi_connection: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(pool, "checkout")
    def ping_if_idle(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        idle_since = record.info.get("idle_since")
        if idle_since is None or time.monotonic() - idle_since <= after_seconds:
            return  # new, or back in the pool only a moment ago
        try:
            alive = dialect.do_ping(dbapi_connection)
        except Exception as error:
            raise exc.DisconnectionError("the pooled connection is gone") from error
        if not alive:
            raise exc.DisconnectionError("the pooled connection is gone")


def _bound_prepared_statements(engine: AsyncEngine) -> None:
    @event.listens_for(engine.sync_engine, "connect")
    def keep_at_most(dbapi_connection: Any, _record: Any) -> None:
        driver = dbapi_connection.driver_connection  # visible: ok sets a bound, sends nothing
        driver.prepared_max = PREPARED_MAX


def _session_defaults_on_connect(engine: AsyncEngine, role: str | None, timeout_ms: int) -> None:
    if role and not role.replace("_", "").isalnum():
        raise ValueError(f"MEMGATE_DB_APP_ROLE must be a plain identifier, not {role!r}")
    settings = ([f'SET ROLE "{role}"'] if role else []) + (
        [f"SET statement_timeout = {int(timeout_ms)}"] if timeout_ms else []
    )

    @event.listens_for(engine.sync_engine, "connect")
    def set_defaults(dbapi_connection: Any, _record: Any) -> None:
        # Outside a transaction: a SET inside one would be undone by the pool's first rollback.
        autocommit = dbapi_connection.autocommit
        dbapi_connection.autocommit = True
        cursor = dbapi_connection.cursor()
        for statement in settings:
            cursor.execute(statement)
        cursor.close()
        dbapi_connection.autocommit = autocommit


def create_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False, autoflush=False)


def with_database(url: str, name: str) -> str:
    """The same server URL pointed at another database."""
    from sqlalchemy.engine import make_url

    return make_url(url).set(database=name).render_as_string(hide_password=False)
