"""Pooled connections are pinged only after they sat idle: a call on a connection used a moment
ago costs no extra round trip, and a connection that died while idle is replaced before use."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
from sqlalchemy import text

from service.db.session import create_engine


def _count_pings(engine: Any) -> list[int]:
    """Counts the dialect's pings (the real ping still runs against the database)."""
    dialect = engine.sync_engine.dialect
    pings = [0]
    real = dialect.do_ping

    def counted(dbapi_connection: Any) -> bool:
        pings[0] += 1
        return bool(real(dbapi_connection))

    dialect.do_ping = counted
    return pings


async def _backend_pid(engine: Any) -> int:
    async with engine.connect() as connection:
        return int((await connection.execute(text("SELECT pg_backend_pid()"))).scalar_one())


async def test_a_connection_used_a_moment_ago_is_not_pinged(database_url: str) -> None:
    engine = create_engine(database_url, pool_size=1, max_overflow=0)
    pings = _count_pings(engine)
    try:
        for _ in range(5):
            await _backend_pid(engine)
        assert pings[0] == 0
    finally:
        await engine.dispose()


async def test_an_idle_connection_that_died_is_replaced_before_use(database_url: str) -> None:
    engine = create_engine(database_url, pool_size=1, max_overflow=0, ping_after_idle=0.2)
    pings = _count_pings(engine)
    try:
        first = await _backend_pid(engine)
        with psycopg.connect(database_url, autocommit=True) as owner:
            owner.execute("SELECT pg_terminate_backend(%s)", (first,))
        await asyncio.sleep(0.4)  # idle past the threshold
        second = await _backend_pid(engine)  # no error: the dead one was replaced
        assert second != first
        assert pings[0] == 1
    finally:
        await engine.dispose()


async def test_an_idle_live_connection_is_pinged_and_kept(database_url: str) -> None:
    idle = 0.2
    engine = create_engine(database_url, pool_size=1, max_overflow=0, ping_after_idle=idle)
    pings = _count_pings(engine)
    try:
        first = await _backend_pid(engine)
        await asyncio.sleep(idle * 2)
        assert await _backend_pid(engine) == first
        assert pings[0] == 1
    finally:
        await engine.dispose()
