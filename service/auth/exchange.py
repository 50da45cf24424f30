"""RFC 8693 token exchange at /oauth/token: an agent acts for a user.

The agent authenticates with its own client credentials and presents the user's access token
as `subject_token`. The answer is a token with `sub` = the user and `act.sub` = the agent, whose
scopes are what the agent asked for ∩ what its client is registered for ∩ what the user's token
holds (never an admin scope), and which expires no later than the user's token. The user must
have allowed that agent (`delegations`); a subject token that is itself delegated is refused
(no nested delegation). Every request with the result re-checks the consent and sees only the
spaces both the user and the agent may see (service/policy/visible.py, and RLS).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from joserfc import jwt
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.auth import issuer as oauth
from service.auth.keys import KeyEncryptionKey, active_signing_key
from service.auth.resolver import resolve_principal
from service.auth.scopes import ADMIN_SCOPES
from service.auth.tokens import TokenRejected, TokenVerifier
from service.db.models import Delegation
from service.db.tenancy import name_tenant

TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"  # noqa: S105 (a URN)
ACCESS_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:access_token"  # noqa: S105 (a URN)


_refuse = oauth.refusal


async def exchange(
    session: AsyncSession,
    config: oauth.IssuerConfig,
    kek: KeyEncryptionKey,
    verifier: TokenVerifier,
    agent: oauth.RegisteredClient,
    request: oauth.TokenRequest,
) -> oauth.OAuthAnswer:
    """The exchange for an agent client that has authenticated."""
    form = request.form
    if form.get("subject_token_type") != ACCESS_TOKEN_TYPE or not form.get("subject_token"):
        return _refuse(
            400,
            "invalid_request",
            f"Send the user's access token as subject_token with subject_token_type "
            f"{ACCESS_TOKEN_TYPE}.",
        )
    if form.get("actor_token") or form.get("requested_token_type", ACCESS_TOKEN_TYPE) != (
        ACCESS_TOKEN_TYPE
    ):
        return _refuse(
            400,
            "invalid_request",
            "The acting agent is the authenticated client; only access tokens are issued (no "
            "actor_token, no other requested_token_type).",
        )
    try:
        verified = await verifier.verify(form["subject_token"])
        if verified.act is not None:
            return _refuse(400, "invalid_grant", "A delegated token cannot be delegated again.")
        await name_tenant(session, verified.tenant_id)  # row-level security
        user = await resolve_principal(session, verified)
    except TokenRejected:
        return _refuse(400, "invalid_grant", "The subject_token is not a valid access token.")
    if user.tenant_id != agent.tenant_id or user.principal_id == agent.principal_id:
        return _refuse(400, "invalid_grant", "The user has not allowed this agent to act for it.")
    consent = await session.scalar(
        select(Delegation.agent_id).where(
            Delegation.tenant_id == user.tenant_id,
            Delegation.user_id == user.principal_id,
            Delegation.agent_id == agent.principal_id,
        )
    )
    if consent is None:
        return _refuse(400, "invalid_grant", "The user has not allowed this agent to act for it.")
    ceiling = (agent.allowed_scopes & user.scopes) - ADMIN_SCOPES
    asked = set(form["scope"].split()) if form.get("scope") else set(ceiling)
    granted = asked & ceiling
    if not granted:
        return _refuse(400, "invalid_scope", "None of the requested scopes may be delegated.")
    now = int(time.time())
    expires = min(now + config.ttl_seconds, int(verified.claims.get("exp", now)))
    claims: dict[str, Any] = {
        "iss": config.issuer,
        "aud": config.audience,
        "sub": str(user.principal_id),
        "act": {"sub": str(agent.principal_id)},
        "tenant": str(user.tenant_id),
        "client_id": agent.client_id,
        "scope": " ".join(sorted(granted)),
        "jti": uuid.uuid4().hex,
        "iat": now,
        "nbf": now,
        "exp": expires,
        # Where the user's authority came from, so every request can check it is still live:
        # disabling the client the user's token was issued to stops this token too.
        "subject_issuer": verified.issuer.issuer,
    }
    if verified.issuer.embedded:
        claims["subject_client_id"] = user.client_id
    if verified.issuer.issuer_id is not None:
        # A tenant-registered IdP: every request checks its registration is still there, so
        # deleting the issuer stops this token too (red-team F3), not only at the IdP's `exp`.
        claims["subject_issuer_id"] = str(verified.issuer.issuer_id)
    key = await active_signing_key(session, kek)
    header = {"alg": key.alg, "typ": "at+jwt", "kid": key.kid}
    body = {
        "access_token": jwt.encode(header, claims, key, algorithms=[str(key.alg)]),
        "issued_token_type": ACCESS_TOKEN_TYPE,
        "token_type": "Bearer",
        "expires_in": max(expires - now, 0),
        "scope": claims["scope"],
    }
    return 200, body, []


async def exchange_response(
    session: AsyncSession,
    lookup: async_sessionmaker[AsyncSession],
    config: oauth.IssuerConfig,
    kek: KeyEncryptionKey,
    verifier: TokenVerifier,
    *,
    db_wait: float,
    content_type: str,
    items: list[tuple[str, str]],
    authorization: str,
) -> oauth.TokenOutcome:
    """The token endpoint for `grant_type` = token exchange (the same request rules, and the
    same authentication: no connection held while the secret is checked)."""
    checked = oauth.check_request(content_type, items, authorization)
    if not isinstance(checked, oauth.TokenRequest):
        return oauth.TokenOutcome(checked, failed_authentication=False)
    agent = await oauth.authenticate(lookup, checked, db_wait=db_wait)
    if agent is None:
        refused = _refuse(401, "invalid_client", "Client authentication failed.")
        return oauth.TokenOutcome(refused, failed_authentication=True)
    # Past authentication: the subject token's checks and the signing key, within the wait.
    async with asyncio.timeout(db_wait):
        answer = await exchange(session, config, kek, verifier, agent, checked)
    return oauth.TokenOutcome(answer, failed_authentication=False)
