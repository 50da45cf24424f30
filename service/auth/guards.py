"""Route guards: the scope a route needs is declared next to the route."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler

from service.auth.principal import Principal
from service.auth.scopes import Scope
from service.problems import InsufficientScope

AnyConnection = ASGIConnection[Any, Any, Any, Any]

Guard = Callable[[AnyConnection, BaseRouteHandler], None]


def requires(scope: Scope) -> Guard:
    def guard(connection: AnyConnection, _: BaseRouteHandler) -> None:
        principal: Principal = connection.user
        if not principal.has_scope(scope):
            raise InsufficientScope(
                f"This call needs the '{scope}' scope; the token has "
                f"'{' '.join(sorted(principal.scopes)) or 'none'}'. Request a token with "
                f"scope={scope} (the client must be registered for it).",
                required_scope=str(scope),
            )

    guard.__name__ = f"requires_{scope.replace(':', '_')}"
    return guard
