"""The embedded authorization server's public endpoints: token, JWKS, metadata."""

from __future__ import annotations

import uuid
from typing import Any

import structlog
from litestar import Controller, Request, Response, get, post
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession

from service.auth import operations as ops
from service.auth.exchange import TOKEN_EXCHANGE, exchange_response
from service.auth.issuer import (
    TokenOutcome,
    issued_claims,
    presented_client_id,
    token_response,
)
from service.auth.keys import published_jwks
from service.auth.problems import OAuthOverloaded, oauth_problem
from service.auth.resource import MCP_PATH, WELL_KNOWN, resource_metadata
from service.auth.scopes import ALL_SCOPES
from service.calls import IssuedIdentity
from service.http.audit import call_of
from service.http.deps import Db, Rt
from service.http.errors import PROBLEM_JSON
from service.http.routes import route
from service.quotas.problems import RateLimited
from service.runtime import Runtime

_NO_STORE = {"Cache-Control": "no-store", "Pragma": "no-cache"}
_log = structlog.get_logger("memgate.auth")


def _issued_identity(claims: dict[str, Any]) -> IssuedIdentity:
    return IssuedIdentity(
        tenant_id=uuid.UUID(claims["tenant"]),
        subject=str(claims["sub"]),
        principal_id=uuid.UUID(claims["sub"]),
        client_id=str(claims["client_id"]),
        token_id=str(claims["jti"]),
        scopes=tuple(str(claims["scope"]).split()),
        actor_subject=str(claims["act"]["sub"]) if isinstance(claims.get("act"), dict) else None,
    )


async def _run_grant(
    request: Request[Any, Any, Any],
    db: AsyncSession,
    runtime: Runtime,
    content_type: str,
    items: list[tuple[str, str]],
    authorization: str,
) -> TokenOutcome:
    wait = runtime.settings.auth.token_db_wait_seconds
    if ("grant_type", TOKEN_EXCHANGE) in items:
        return await exchange_response(
            db,
            runtime.sessionmaker,
            runtime.issuer,
            runtime.kek,
            runtime.verifier,
            db_wait=wait,
            content_type=content_type,
            items=items,
            authorization=authorization,
        )
    return await token_response(
        db,
        runtime.sessionmaker,
        runtime.issuer,
        runtime.kek,
        db_wait=wait,
        content_type=content_type,
        items=items,
        authorization=authorization,
    )


def _refusal(
    request: Request[Any, Any, Any], problem: OAuthOverloaded, presented: str | None
) -> Response[dict[str, Any]]:
    """429 or 503 with `Retry-After`, as problem+json with RFC 6749's members, audited."""
    facts = call_of(request).facts
    facts.reason = problem.slug
    facts.client_presented(presented)
    return Response(
        problem.to_body(instance=request.url.path),
        status_code=problem.status,
        headers=_NO_STORE | problem.headers(),
        media_type=PROBLEM_JSON,
    )


class OAuthController(Controller):
    tags = ["oauth"]

    @post("/oauth/token", status_code=200, **route(ops.TOKEN))
    async def token(
        self, request: Request[Any, Any, Any], db: Db, runtime: Rt
    ) -> Response[dict[str, Any]]:
        """OAuth 2 token endpoint: client credentials, and RFC 8693 token exchange (an agent the
        user allowed sends the user's token as `subject_token` and gets one acting for that user:
        `act.sub` = the agent, scope = requested ∩ client's ∩ user token's). Clients authenticate
        with `client_secret_basic` or `client_secret_post`; the answer is a short-lived `at+jwt`
        whose `scope` says what was granted."""
        content_type = request.headers.get("content-type", "")
        items: list[tuple[str, str]] = []
        if content_type.lower().startswith("application/x-www-form-urlencoded"):
            items = [(k, v) for k, v in (await request.form()).multi_items() if isinstance(v, str)]
        authorization = request.headers.get("authorization", "")
        facts = call_of(request).facts
        presented = presented_client_id(items, authorization)
        source = request.client.host if request.client else "unknown"
        try:
            # Turned away before any database or argon2 work (service/auth/throttle.py).
            admission = runtime.token_gate.admit(presented, source)
        except OAuthOverloaded as refused:
            return _refusal(request, refused, presented)
        outcome: TokenOutcome | None = None
        try:
            outcome = await _run_grant(request, db, runtime, content_type, items, authorization)
        except (TimeoutError, SQLAlchemyError) as exc:
            # A pool timeout or a database that does not answer: the client may retry, and the
            # endpoint never answers 500 for it.
            _log.warning("token_request_database_unavailable", error_type=type(exc).__name__)
            busy = OAuthOverloaded(
                "The token endpoint could not reach its database in time. Retry after 1 s.",
                retry_after=1,
            )
            return _refusal(request, busy, presented)
        finally:
            # A database that did not answer is not the caller's failure.
            admission.settle(failed=outcome is not None and outcome.failed_authentication)
        status, body, extra = outcome.answer
        response_headers = dict(_NO_STORE)
        response_headers.update({k: v for k, v in extra if k.lower() == "www-authenticate"})
        if status >= 400:
            problem = oauth_problem(str(body.get("error")), body.get("error_description"))
            facts.reason = problem.slug
            facts.client_presented(presented)
            return Response(
                problem.to_body(instance=request.url.path),
                status_code=status,
                headers=response_headers,
                media_type=PROBLEM_JSON,
            )
        issued = _issued_identity(issued_claims(str(body["access_token"])))
        try:  # the tenant's and the client's token-request limits, once the client is proven
            await runtime.quotas.admit_token(issued.tenant_id, issued.client_id)
        except RateLimited as limited:  # the token just signed is never sent
            facts.reason = limited.slug
            facts.client_presented(presented)
            return Response(
                limited.to_body(instance=request.url.path),
                status_code=limited.status,
                headers=_NO_STORE | limited.headers(),
                media_type=PROBLEM_JSON,
            )
        facts.issued = issued
        return Response(body, status_code=status, headers=response_headers)

    @get("/.well-known/jwks.json", **route(ops.JWKS))
    async def jwks(self, db: Db) -> Response[dict[str, Any]]:
        """Public signing keys of the embedded issuer (next, active and still-valid retired)."""
        return Response(await published_jwks(db), headers={"Cache-Control": "max-age=300"})

    @get("/.well-known/oauth-authorization-server", **route(ops.METADATA))
    async def metadata(self, runtime: Rt) -> dict[str, Any]:
        """RFC 8414 authorization server metadata."""
        issuer = runtime.issuer.issuer
        return {
            "issuer": issuer,
            "token_endpoint": f"{issuer}/oauth/token",
            "jwks_uri": f"{issuer}/.well-known/jwks.json",
            "grant_types_supported": ["client_credentials", TOKEN_EXCHANGE],
            "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post"],
            "scopes_supported": sorted(ALL_SCOPES),
            "response_types_supported": ["token"],
        }

    @get(WELL_KNOWN, **route(ops.RESOURCE_METADATA))
    async def protected_resource(self, runtime: Rt) -> dict[str, Any]:
        """RFC 9728 protected resource metadata of the API: the authorization servers whose
        tokens it accepts (the embedded issuer and the trusted external ones) and its scopes."""
        return resource_metadata(runtime.settings)

    @get(WELL_KNOWN + MCP_PATH, **route(ops.MCP_RESOURCE_METADATA))
    async def mcp_protected_resource(self, runtime: Rt) -> dict[str, Any]:
        """RFC 9728 protected resource metadata of the MCP endpoint (`/mcp`), where MCP clients
        start their authorization discovery; the same servers and scopes as the API."""
        return resource_metadata(runtime.settings, MCP_PATH)
