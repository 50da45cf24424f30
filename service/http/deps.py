"""Request-scoped dependencies: the runtime and one transaction per request."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import cast

from litestar.datastructures import State
from litestar.di import NamedDependency
from sqlalchemy.ext.asyncio import AsyncSession

from service.runtime import Runtime


def provide_runtime(state: State) -> Runtime:
    return cast(Runtime, state.runtime)


async def provide_db(state: State) -> AsyncGenerator[AsyncSession, None]:
    """The request owns the transaction: committed when the handler returns, rolled back when it
    raises (Litestar throws handler exceptions into this generator)."""
    runtime = cast(Runtime, state.runtime)
    async with runtime.sessionmaker() as session, session.begin():
        yield session


Db = NamedDependency[AsyncSession]
"""The request's session (one transaction per request)."""
Rt = NamedDependency[Runtime]
