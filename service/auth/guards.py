"""Route guards: the scope a route needs is declared next to the route."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler

from service.auth.principal import Principal
from service.auth.scopes import Scope, insufficient_scope

AnyConnection = ASGIConnection[Any, Any, Any, Any]

Guard = Callable[[AnyConnection, BaseRouteHandler], None]


def requires(scope: Scope) -> Guard:
    def guard(connection: AnyConnection, _: BaseRouteHandler) -> None:
        principal: Principal = connection.user
        if not principal.has_scope(scope):
            raise insufficient_scope(principal, scope)

    guard.__name__ = f"requires_{scope.replace(':', '_')}"
    return guard
