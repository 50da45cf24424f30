"""Bearer authentication for Litestar: verify the JWT, then resolve the principal."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any, cast

import structlog
from litestar.middleware import AbstractAuthenticationMiddleware, AuthenticationResult

from service.auth.guards import AnyConnection
from service.auth.resolver import resolve_principal
from service.auth.tokens import TokenRejected
from service.db.tenancy import name_tenant
from service.http.audit import find_call, operation_of
from service.observability.telemetry import span
from service.problems import NotAuthenticated

if TYPE_CHECKING:
    from service.runtime import Runtime


class BearerAuthentication(AbstractAuthenticationMiddleware):
    async def authenticate_request(self, connection: AnyConnection) -> AuthenticationResult:
        header = connection.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise NotAuthenticated(
                "This endpoint needs a bearer token: POST /oauth/token with your client "
                "credentials, then send 'Authorization: Bearer <access_token>'.",
                error="missing_token",
            )
        runtime = cast("Runtime", connection.app.state.runtime)
        with span("auth.authenticate"):
            try:
                verified = await runtime.verifier.verify(token.strip())
                call = find_call(connection.scope)
                if call is not None:
                    operation = operation_of(cast("MutableMapping[str, Any]", connection.scope))
                    read_only = operation is not None and operation.read_only
                    principal = await call.enter(verified, read_only=read_only)
                else:  # only outside the app's call adapter (the app always installs it)
                    async with runtime.sessionmaker() as session:
                        await name_tenant(session, verified.tenant_id)
                        principal = await resolve_principal(session, verified)
            except TokenRejected as exc:
                raise NotAuthenticated(
                    f"The access token was rejected ({exc}). Get a new token from /oauth/token.",
                ) from None
        structlog.contextvars.bind_contextvars(
            tenant=str(principal.tenant_id),
            principal=str(principal.principal_id),
            client=principal.client_id,
        )
        return AuthenticationResult(user=principal, auth=verified)
