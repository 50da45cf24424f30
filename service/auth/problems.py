"""Problems of the token endpoint. Each RFC 6749 §5.2 error code is a problem type of its own, so
OAuth clients read `error` and everyone else reads the RFC 9457 members, from one body."""

from __future__ import annotations

from service.problems import Problem

_TITLE = "Token request refused"


class OAuthInvalidRequest(Problem, slug="oauth-invalid-request", status=400, title=_TITLE):
    """The token request is malformed: not a form body, a repeated parameter, or two client
    authentication methods at once."""


class OAuthInvalidClient(Problem, slug="oauth-invalid-client", status=401, title=_TITLE):
    """Client authentication failed. Unknown, disabled and live client ids answer alike."""


class OAuthInvalidGrant(Problem, slug="oauth-invalid-grant", status=400, title=_TITLE):
    """The grant is invalid, expired or revoked."""


class OAuthUnauthorizedClient(Problem, slug="oauth-unauthorized-client", status=400, title=_TITLE):
    """The client may not use this grant type."""


class OAuthUnsupportedGrantType(
    Problem, slug="oauth-unsupported-grant-type", status=400, title=_TITLE
):
    """Only `client_credentials` is supported."""


class OAuthInvalidScope(Problem, slug="oauth-invalid-scope", status=400, title=_TITLE):
    """None of the requested scopes may be granted to this client."""


class OAuthOverloaded(Problem, slug="oauth-overloaded", status=503, title="Token endpoint busy"):
    """Too many token requests are in flight (in the process, from this source or for this
    client id), or the database did not answer in time; nothing failed and nothing was counted
    against the caller. Retry after `retry_after` seconds (also in `Retry-After`). Tokens
    already issued keep working. Carries RFC 6749's members too (`error`:
    `temporarily_unavailable`)."""

    def __init__(self, detail: str, *, retry_after: int) -> None:
        super().__init__(
            detail,
            error="temporarily_unavailable",
            error_description=detail,
            retry_after=retry_after,
        )
        self.retry_after = retry_after

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}


class OAuthTooManyFailures(
    OAuthOverloaded, slug="oauth-too-many-failures", status=429, title="Too many failed attempts"
):
    """This client id or this source address failed client authentication too often lately;
    retry after `retry_after` seconds (also in `Retry-After`) with the right credentials."""


OAUTH_PROBLEMS: dict[str, type[Problem]] = {
    "invalid_request": OAuthInvalidRequest,
    "invalid_client": OAuthInvalidClient,
    "invalid_grant": OAuthInvalidGrant,
    "unauthorized_client": OAuthUnauthorizedClient,
    "unsupported_grant_type": OAuthUnsupportedGrantType,
    "invalid_scope": OAuthInvalidScope,
}


def oauth_problem(error: str, description: str | None) -> Problem:
    """The problem for an RFC 6749 error answer, carrying its `error` members too."""
    kind = OAUTH_PROBLEMS.get(error, OAuthInvalidRequest)
    # authlib leaves some descriptions empty; the type's own sentence says what to do instead.
    detail = description or " ".join((kind.__doc__ or error).split())
    return kind(detail, error=error, error_description=detail)
