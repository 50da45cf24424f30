"""How the client gets its access tokens from memgate's `/oauth/token`.

- `ClientCredentials`: RFC 6749 §4.4, the client's id and secret sent as HTTP Basic
  (`client_secret_basic`).
- `TokenExchange`: RFC 8693, an agent acting for a user who allowed it
  (`PUT /v1/principals/{user}/delegates/{agent}`): the agent authenticates with its own
  credentials and sends the user's access token as `subject_token`; the answer acts for the
  user (`sub` = user, `act.sub` = agent) with scope = asked ∩ agent's ∩ user token's, and
  expires no later than the user's token. The user's token comes from the user's own
  `ClientCredentials` (fetched and refreshed like any token) or is a fixed string (then it
  cannot be renewed: once it expires, exchanges fail with `oauth-invalid-grant`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"  # noqa: S105 (a URN)
ACCESS_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:access_token"  # noqa: S105 (a URN)


def _scope(scope: str | Sequence[str] | None) -> str | None:
    if scope is None or isinstance(scope, str):
        return scope
    return " ".join(scope)


@dataclass(frozen=True)
class ClientCredentials:
    client_id: str
    client_secret: str
    scope: str | Sequence[str] | None = None
    """The scopes to ask for (None: all the client is registered for)."""

    def form(self) -> dict[str, str]:
        form = {"grant_type": "client_credentials"}
        if (scope := _scope(self.scope)) is not None:
            form["scope"] = scope
        return form

    def __repr__(self) -> str:  # never the secret
        return f"ClientCredentials(client_id={self.client_id!r}, scope={self.scope!r})"


@dataclass(frozen=True)
class TokenExchange:
    client_id: str
    """The agent's client."""
    client_secret: str
    subject: ClientCredentials | str
    """The user the agent acts for: their credentials, or their access token."""
    scope: str | Sequence[str] | None = None

    def form(self, subject_token: str) -> dict[str, str]:
        form = {
            "grant_type": TOKEN_EXCHANGE,
            "subject_token": subject_token,
            "subject_token_type": ACCESS_TOKEN_TYPE,
            "requested_token_type": ACCESS_TOKEN_TYPE,
        }
        if (scope := _scope(self.scope)) is not None:
            form["scope"] = scope
        return form

    def __repr__(self) -> str:
        return f"TokenExchange(client_id={self.client_id!r}, scope={self.scope!r})"


Credentials = ClientCredentials | TokenExchange


def refresh_margin(expires_in: float) -> float:
    """How long before its expiry a token is replaced: 1 s plus a fifth of its life, at most
    60 s. The 1 s covers `expires_in` being whole seconds (the real life may be up to a second
    shorter) and the request's own trip; the fifth, clocks that drift apart."""
    return min(60.0, 1.0 + 0.2 * max(expires_in, 0.0))


@dataclass(frozen=True)
class CachedToken:
    token: str
    refresh_at: float
    """On the client's clock (monotonic by default): after this, fetch a new one first."""

    @classmethod
    def issued(cls, token: str, expires_in: float, asked_at: float) -> CachedToken:
        # Counted from when the request left, not when the answer came: never later than real.
        return cls(token, asked_at + max(expires_in, 0.0) - refresh_margin(expires_in))


__all__ = [
    "ACCESS_TOKEN_TYPE",
    "TOKEN_EXCHANGE",
    "CachedToken",
    "ClientCredentials",
    "Credentials",
    "TokenExchange",
    "refresh_margin",
]
