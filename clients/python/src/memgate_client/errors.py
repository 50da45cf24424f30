"""memgate's RFC 9457 problems as exceptions: one class per status, a few per slug.

Every error answer of memgate is `application/problem+json` with `type`, `title`, `status` and
`detail`, and sometimes more members (`errors`, `retry_after`, `keys`, `required_scope` ...):
those are `extensions`. The class raised is the slug's own when this module declares one
(`MemoryNotFound`, `KeyChoiceRequired`, `BatchRejected` ...), else the status's (`NotFound`,
`Conflict` ...), else `MemgateProblem`; so `except NotFound` catches every 404 and
`except MemoryNotFound` only that one. A slug this client does not know still gets its status's
class, with `slug` and `extensions` intact.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, ClassVar, TypedDict

import httpx

PROBLEM_BASE_URI = "https://memgate.dev/problems/"


class MemgateError(Exception):
    """Anything this client raises on purpose."""


class MemgateConnectionError(MemgateError):
    """The server could not be reached (or dropped the connection) and the request was not
    retried, or every retry failed too. `__cause__` is httpx's error."""


class UnexpectedAnswer(MemgateError):
    """The server answered what memgate never does: a redirect (never followed: it would carry
    a request body, a client secret or the user's token elsewhere), a success that is not the
    JSON asked for, a token answer without its fields, a page cursor given twice. A hostile or
    broken server, a proxy's page, or a wrong `base_url`."""


class UnsafePathId(MemgateError, ValueError):
    """An id that would change the path it is put in (empty, `.` or `..`: HTTP clients remove
    dot segments, so `get_memory("..")` asked for another resource). Ids can come from model
    output; they are refused before anything is sent."""


class MemgateProblem(MemgateError):
    """An error answer. `status`, `type`, `title`, `detail`: RFC 9457's members; `extensions`:
    the others; `headers`: the answer's headers (`Retry-After`, `WWW-Authenticate` ...)."""

    status_code: ClassVar[int | None] = None
    """The status this class stands for (None: any)."""
    slugs: ClassVar[tuple[str, ...]] = ()
    """The problem slugs this class stands for (empty: any of its status)."""

    def __init__(
        self,
        *,
        status: int,
        type: str = "about:blank",
        title: str = "",
        detail: str = "",
        instance: str | None = None,
        extensions: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(f"{status} {title}: {detail}" if detail else f"{status} {title}")
        self.status = status
        self.type = type
        self.title = title
        self.detail = detail
        self.instance = instance
        self.extensions: dict[str, Any] = dict(extensions or {})
        self.headers: dict[str, str] = dict(headers or {})

    @property
    def slug(self) -> str:
        """The last part of `type` (`memory-not-found`); `about:blank` for a bare status."""
        if self.type.startswith(PROBLEM_BASE_URI):
            return self.type.removeprefix(PROBLEM_BASE_URI)
        return self.type

    @property
    def retry_after(self) -> float | None:
        """Seconds to wait before retrying, from `retry_after` or `Retry-After`, if given."""
        return retry_after_of(self.extensions, self.headers)


def retry_after_of(body: Mapping[str, Any], headers: Mapping[str, str]) -> float | None:
    for raw in (body.get("retry_after"), _header(headers, "retry-after")):
        try:
            seconds = float(raw) if raw is not None else None
        except (TypeError, ValueError):
            continue  # an HTTP date: not something memgate sends
        if seconds is not None and seconds >= 0:
            return seconds
    return None


def _header(headers: Mapping[str, str], name: str) -> str | None:
    for key, value in headers.items():
        if key.lower() == name:
            return value
    return None


# --- by status --------------------------------------------------------------------------------


class BadRequest(MemgateProblem):
    status_code = 400


class Unauthorized(MemgateProblem):
    """401: no valid token (`unauthenticated`), or the token endpoint refused the client
    (`oauth-invalid-client`)."""

    status_code = 401


class Forbidden(MemgateProblem):
    status_code = 403


class NotFound(MemgateProblem):
    """404: missing, or another tenant's, or invisible to the caller: memgate answers alike."""

    status_code = 404


class MethodNotAllowed(MemgateProblem):
    status_code = 405


class Conflict(MemgateProblem):
    status_code = 409


class PayloadTooLarge(MemgateProblem):
    status_code = 413


class UnsupportedMediaType(MemgateProblem):
    status_code = 415


class Unprocessable(MemgateProblem):
    """422: the request did not validate or may not be done; nothing changed."""

    status_code = 422


class RateLimited(MemgateProblem):
    """429: a rate, concurrency or storage quota; `retry_after` says when to try again."""

    status_code = 429


class ServerError(MemgateProblem):
    status_code = 500


class BadGateway(MemgateProblem):
    status_code = 502


class ServiceUnavailable(MemgateProblem):
    status_code = 503


class GatewayTimeout(MemgateProblem):
    status_code = 504


# --- by slug ----------------------------------------------------------------------------------


class InvalidRequest(Unprocessable):
    """`invalid-request`: `errors` names each offending field."""

    slugs = ("invalid-request",)

    @property
    def errors(self) -> list[dict[str, Any]]:
        found = self.extensions.get("errors")
        return list(found) if isinstance(found, list) else []


class InsufficientScope(Forbidden):
    """`insufficient-scope`: `required_scope` is the scope the token lacks."""

    slugs = ("insufficient-scope",)

    @property
    def required_scope(self) -> str | None:
        found = self.extensions.get("required_scope")
        return str(found) if found is not None else None


class MemoryNotFound(NotFound):
    slugs = ("memory-not-found",)


class KeyChoiceRequired(Conflict):
    """`key-choice-required` (the write gate): `keys` lists the subject's live keys of that
    kind; resend under one of them, or with `new_key=True`."""

    slugs = ("key-choice-required",)

    @property
    def keys(self) -> list[dict[str, Any]]:
        found = self.extensions.get("keys")
        return list(found) if isinstance(found, list) else []


class BatchItemError(TypedDict):
    """One failing item of a rejected batch."""

    index: int
    status: int
    type: str
    title: str
    detail: str


class BatchRejected(Unprocessable):
    """`batch-rejected`: `errors` has one entry per failing item; nothing was written."""

    slugs = ("batch-rejected",)

    @property
    def errors(self) -> list[BatchItemError]:
        found = self.extensions.get("errors")
        return list(found) if isinstance(found, list) else []


class IdempotencyKeyReused(Unprocessable):
    """The `Idempotency-Key` was used before with another body."""

    slugs = ("idempotency-key-reused",)


class IdempotencyKeyInFlight(Conflict):
    """The first call with this `Idempotency-Key` is still running; `retry_after` says when
    to ask again (the client does so itself, within its retry budget)."""

    slugs = ("idempotency-key-in-flight",)


class TokenRefused(MemgateProblem):
    """The token endpoint refused the request (`oauth-*`); `error` is RFC 6749's code."""

    slugs: ClassVar[tuple[str, ...]] = (
        "oauth-invalid-client",
        "oauth-invalid-grant",
        "oauth-invalid-request",
        "oauth-invalid-scope",
        "oauth-unauthorized-client",
        "oauth-unsupported-grant-type",
    )

    @property
    def error(self) -> str | None:
        found = self.extensions.get("error")
        return str(found) if found is not None else None


class InvalidClient(TokenRefused, Unauthorized):
    slugs = ("oauth-invalid-client",)


class InvalidGrant(TokenRefused, BadRequest):
    slugs = ("oauth-invalid-grant",)


class InvalidScope(TokenRefused, BadRequest):
    slugs = ("oauth-invalid-scope",)


class InvalidTokenRequest(TokenRefused, BadRequest):
    slugs = ("oauth-invalid-request",)


class UnauthorizedClient(TokenRefused, BadRequest):
    slugs = ("oauth-unauthorized-client",)


class UnsupportedGrantType(TokenRefused, BadRequest):
    slugs = ("oauth-unsupported-grant-type",)


class QuotaExceeded(RateLimited):
    slugs = ("quota-exceeded",)


_BY_STATUS: dict[int, type[MemgateProblem]] = {}
_BY_SLUG: dict[str, type[MemgateProblem]] = {}


def _register(cls: type[MemgateProblem]) -> None:
    for sub in cls.__subclasses__():
        if sub.slugs and len(sub.slugs) == 1:
            _BY_SLUG.setdefault(sub.slugs[0], sub)
        elif not sub.slugs and sub.status_code is not None:
            _BY_STATUS.setdefault(sub.status_code, sub)
        _register(sub)


_register(MemgateProblem)


def problem_class(slug: str, status: int) -> type[MemgateProblem]:
    """The class raised for this slug and status: the slug's own when its status agrees,
    else the status's, else `MemgateProblem`."""
    by_slug = _BY_SLUG.get(slug)
    if by_slug is not None and by_slug.status_code in (None, status):
        return by_slug
    return _BY_STATUS.get(status, MemgateProblem)


def problem_from_response(response: httpx.Response) -> MemgateProblem:
    """The exception for an error answer; a body that is no problem document (a proxy's HTML
    page) still gives its status's class, with the reason phrase as title."""
    try:
        body = json.loads(response.content)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        body = {}
    known = {"type", "title", "status", "detail", "instance"}
    kind = str(body.get("type") or "about:blank")
    slug = kind.removeprefix(PROBLEM_BASE_URI)
    cls = problem_class(slug, response.status_code)
    return cls(
        status=response.status_code,
        type=kind,
        title=str(body.get("title") or response.reason_phrase),
        detail=str(body.get("detail") or ""),
        instance=str(body["instance"]) if body.get("instance") is not None else None,
        extensions={k: v for k, v in body.items() if k not in known},
        headers=dict(response.headers),
    )


__all__ = [
    "PROBLEM_BASE_URI",
    "BadGateway",
    "BadRequest",
    "BatchItemError",
    "BatchRejected",
    "Conflict",
    "Forbidden",
    "GatewayTimeout",
    "IdempotencyKeyInFlight",
    "IdempotencyKeyReused",
    "InsufficientScope",
    "InvalidClient",
    "InvalidGrant",
    "InvalidRequest",
    "InvalidScope",
    "InvalidTokenRequest",
    "KeyChoiceRequired",
    "MemgateConnectionError",
    "MemgateError",
    "MemgateProblem",
    "MemoryNotFound",
    "MethodNotAllowed",
    "NotFound",
    "PayloadTooLarge",
    "QuotaExceeded",
    "RateLimited",
    "ServerError",
    "ServiceUnavailable",
    "TokenRefused",
    "Unauthorized",
    "UnauthorizedClient",
    "Unprocessable",
    "UnsupportedGrantType",
    "UnsupportedMediaType",
    "problem_class",
    "problem_from_response",
]
