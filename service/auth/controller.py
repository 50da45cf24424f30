"""The embedded authorization server's public endpoints: token, JWKS, metadata."""

from __future__ import annotations

import uuid
from typing import Any

from litestar import Controller, Request, Response, get, post

from service.audit.trail import IssuedIdentity, trail_of
from service.auth.exchange import TOKEN_EXCHANGE, exchange_response
from service.auth.issuer import issued_claims, presented_client_id, token_response
from service.auth.keys import published_jwks
from service.auth.problems import oauth_problem
from service.auth.scopes import ALL_SCOPES
from service.http.deps import Db, Rt
from service.http.errors import PROBLEM_JSON

_NO_STORE = {"Cache-Control": "no-store", "Pragma": "no-cache"}


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


class OAuthController(Controller):
    tags = ["oauth"]
    opt = {"exclude_from_auth": True}

    @post("/oauth/token", status_code=200, opt={"action": "auth.token"})
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
        if ("grant_type", TOKEN_EXCHANGE) in items:
            status, body, extra = await exchange_response(
                db,
                runtime.issuer,
                runtime.kek,
                runtime.verifier,
                content_type=content_type,
                items=items,
                authorization=authorization,
            )
        else:
            status, body, extra = await token_response(
                db,
                runtime.issuer,
                runtime.kek,
                content_type=content_type,
                items=items,
                authorization=authorization,
            )
        response_headers = dict(_NO_STORE)
        response_headers.update({k: v for k, v in extra if k.lower() == "www-authenticate"})
        trail = trail_of(request)
        if status >= 400:
            problem = oauth_problem(str(body.get("error")), body.get("error_description"))
            trail.reason = problem.slug
            trail.client_presented(
                presented_client_id(items, request.headers.get("authorization", ""))
            )
            return Response(
                problem.to_body(instance=request.url.path),
                status_code=status,
                headers=response_headers,
                media_type=PROBLEM_JSON,
            )
        trail.issued = _issued_identity(issued_claims(str(body["access_token"])))
        return Response(body, status_code=status, headers=response_headers)

    @get("/.well-known/jwks.json", opt={"action": "auth.jwks"})
    async def jwks(self, db: Db) -> Response[dict[str, Any]]:
        """Public signing keys of the embedded issuer (next, active and still-valid retired)."""
        return Response(await published_jwks(db), headers={"Cache-Control": "max-age=300"})

    @get("/.well-known/oauth-authorization-server", opt={"action": "auth.metadata"})
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
