"""Request-scoped dependencies: the runtime, the request's call and its session."""

from __future__ import annotations

from typing import Any, cast

from litestar import Request
from litestar.datastructures import State
from litestar.di import NamedDependency
from sqlalchemy.ext.asyncio import AsyncSession

from service.calls import Call
from service.http.audit import call_of_scope
from service.runtime import Runtime


def provide_runtime(state: State) -> Runtime:
    return cast(Runtime, state.runtime)


def provide_call(request: Request[Any, Any, Any]) -> Call:
    """The request's call (service/calls.py): it ends the transaction when the response starts,
    committed with the call's audit row when the call succeeded, rolled back otherwise."""
    return call_of_scope(request.scope)


def provide_db(request: Request[Any, Any, Any]) -> AsyncSession:
    """The call's session (one transaction per call, begun on its first statement)."""
    return call_of_scope(request.scope).db


def trusted_issuers(request: Request[Any, Any, Any]) -> frozenset[str]:
    """The `iss` of the configured external issuers, for the services that map principals to
    them or count the admins they let log in."""
    return provide_runtime(request.app.state).settings.auth.trusted_external_issuers


Db = NamedDependency[AsyncSession]
"""The call's session (one transaction per call)."""
Rt = NamedDependency[Runtime]
CallDep = NamedDependency[Call]
