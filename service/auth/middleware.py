"""Bearer authentication for Litestar: verify the JWT, then resolve the principal."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any, cast

import structlog
from litestar.middleware import AbstractAuthenticationMiddleware, AuthenticationResult

from service.auth.guards import AnyConnection
from service.auth.resource import metadata_url
from service.auth.tokens import TokenRejected
from service.http.audit import call_of_scope, operation_of
from service.observability.telemetry import route_of, span
from service.problems import NotAuthenticated

if TYPE_CHECKING:
    from service.runtime import Runtime

_log = structlog.get_logger("memgate.auth")


class BearerAuthentication(AbstractAuthenticationMiddleware):
    async def authenticate_request(self, connection: AnyConnection) -> AuthenticationResult:
        header = connection.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        runtime = cast("Runtime", connection.app.state.runtime)
        # Every 401 names the RFC 9728 document a client discovers the issuers from.
        discovery = metadata_url(runtime.settings.server.public_url, route_of(connection.scope))
        if scheme.lower() != "bearer" or not token.strip():
            raise NotAuthenticated(
                "This endpoint needs a bearer token: POST /oauth/token with your client "
                "credentials, then send 'Authorization: Bearer <access_token>'.",
                error="missing_token",
                resource_metadata=discovery,
            )
        with span("auth.authenticate"):
            try:
                verified = await runtime.verifier.verify(token.strip())
                # The principal is checked in the request's call (service/calls.py).
                scope = cast("MutableMapping[str, Any]", connection.scope)
                operation = operation_of(scope)
                principal = await call_of_scope(scope).enter(
                    verified, read_only=operation is not None and operation.read_only
                )
            except TokenRejected as exc:
                # The precise reason is fixed text (never the token's): logged, and kept in the
                # audit row when the answer is deliberately vaguer.
                _log.info("token_rejected", reason=exc.reason or str(exc))
                raise NotAuthenticated(
                    f"The access token was rejected ({exc}). Get a new token from /oauth/token.",
                    resource_metadata=discovery,
                    reason=exc.reason,
                ) from None
        structlog.contextvars.bind_contextvars(
            tenant=str(principal.tenant_id),
            principal=str(principal.principal_id),
            client=principal.client_id,
        )
        return AuthenticationResult(user=principal, auth=verified)
