"""Request-scoped dependencies: the runtime and one transaction per request."""

from __future__ import annotations

from typing import Any, cast

from litestar import Request
from litestar.datastructures import State
from litestar.di import NamedDependency
from sqlalchemy.ext.asyncio import AsyncSession

from service.audit.trail import trail_of_scope
from service.auth.principal import Principal
from service.runtime import Runtime


def provide_runtime(state: State) -> Runtime:
    return cast(Runtime, state.runtime)


async def provide_db(request: Request[Any, Any, Any]) -> AsyncSession:
    """The request owns one transaction. The audit recorder ends it when the response starts:
    committed together with the call's audit row when the call succeeded, rolled back otherwise
    (service/audit/recorder.py)."""
    caller = request.scope.get("user")
    return await trail_of_scope(request.scope).request_session(
        caller if isinstance(caller, Principal) else None
    )


def trusted_issuers(request: Request[Any, Any, Any]) -> frozenset[str]:
    """The `iss` of the configured external issuers, for the services that map principals to
    them or count the admins they let log in."""
    return provide_runtime(request.app.state).settings.auth.trusted_external_issuers


Db = NamedDependency[AsyncSession]
"""The request's session (one transaction per request)."""
Rt = NamedDependency[Runtime]
