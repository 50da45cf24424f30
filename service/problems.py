"""RFC 9457 problems: every error class declares its wire identity where it is defined.

A subclass names its slug, status and title once:

    class MemoryNotFound(Problem, slug="memory-not-found", status=404, title="Memory not found"):
        ...

`app.py` maps every `Problem` to `application/problem+json`; `PROBLEM_TYPES` lists them for
`openapi.yaml` and the `/problems` index. Domain code raises these; it never builds responses.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

PROBLEM_BASE_URI = "https://memgate.dev/problems/"

PROBLEM_TYPES: dict[str, type[Problem]] = {}


class Problem(Exception):
    slug: ClassVar[str] = "about:blank"
    status: ClassVar[int] = 500
    title: ClassVar[str] = "Internal error"

    def __init_subclass__(cls, *, slug: str, status: int, title: str, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.slug, cls.status, cls.title = slug, status, title
        if slug in PROBLEM_TYPES and PROBLEM_TYPES[slug] is not cls:
            raise TypeError(f"problem slug {slug!r} is declared twice")
        PROBLEM_TYPES[slug] = cls

    def __init__(self, detail: str, **extensions: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extensions = extensions

    @classmethod
    def type_uri(cls) -> str:
        return PROBLEM_BASE_URI + cls.slug

    def audit_reason(self) -> str:
        """The audit row's `reason`: the slug, unless a problem knows more than it answers."""
        return self.slug

    def headers(self) -> dict[str, str]:
        return {}

    def to_body(self, instance: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "type": self.type_uri(),
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
        }
        if instance:
            body["instance"] = instance
        body.update(self.extensions)
        return body


class InvalidRequest(Problem, slug="invalid-request", status=422, title="Invalid request"):
    """The body, query or path did not validate; `errors` names each offending field."""


class MalformedRequest(Problem, slug="malformed-request", status=400, title="Malformed request"):
    """The body is not parseable JSON (not UTF-8, a syntax error, a lone surrogate escape)."""


class UnsupportedMediaType(
    Problem, slug="unsupported-media-type", status=415, title="Unsupported media type"
):
    """The route takes a JSON body and the request's `Content-Type` is not `application/json`
    (UTF-8); `accepted` lists what it takes."""


class BadCursor(Problem, slug="bad-cursor", status=400, title="Bad cursor"):
    """The pagination cursor was not produced by this API (or was altered)."""


class MalformedId(Problem, slug="malformed-id", status=400, title="Malformed id"):
    """An id in the path, the query or the body is not a UUID; `errors` names the field when it
    is not in the path."""


class BodyTooLarge(Problem, slug="body-too-large", status=413, title="Request body too large"):
    """The request body exceeds the configured limit."""


class NotAuthenticated(
    Problem, slug="unauthenticated", status=401, title="Authentication required"
):
    """No valid bearer token. Carries `WWW-Authenticate` so clients know how to get one: with
    `resource_metadata` (RFC 9728 §5.1) naming the protected-resource metadata document, which
    names the authorization servers (MCP clients start their discovery there)."""

    def __init__(
        self,
        detail: str,
        *,
        error: str = "invalid_token",
        resource_metadata: str | None = None,
        reason: str | None = None,
        **extensions: Any,
    ) -> None:
        """`reason`: the precise, fixed-text cause a deliberately vague detail leaves out (a
        tenant-registered issuer's refusal); audited, never answered."""
        super().__init__(detail, **extensions)
        self.error = error
        self.resource_metadata = resource_metadata
        self.reason = reason

    def audit_reason(self) -> str:
        if self.reason is None:
            return self.slug
        return f"{self.slug}:{re.sub(r'[^a-z0-9]+', '-', self.reason.lower()).strip('-')}"

    def headers(self) -> dict[str, str]:
        parts = ['realm="memgate"']
        if self.resource_metadata is not None:
            parts.append(f'resource_metadata="{self.resource_metadata}"')
        if self.error != "missing_token":
            parts.append(f'error="{self.error}"')
        return {"WWW-Authenticate": "Bearer " + ", ".join(parts)}


class InsufficientScope(Problem, slug="insufficient-scope", status=403, title="Insufficient scope"):
    """The token lacks the scope this route requires; `required_scope` says which."""

    def headers(self) -> dict[str, str]:
        scope = self.extensions.get("required_scope", "")
        challenge = f'Bearer realm="memgate", error="insufficient_scope", scope="{scope}"'
        return {"WWW-Authenticate": challenge}


class RouteNotFound(Problem, slug="route-not-found", status=404, title="No such route"):
    """No route matches the path."""


class MethodNotAllowed(Problem, slug="method-not-allowed", status=405, title="Method not allowed"):
    """The route exists but not for this HTTP method."""


class ServiceUnavailable(Problem, slug="service-unavailable", status=503, title="Unavailable"):
    """A dependency (database, embedding provider) is not reachable; retry later."""

    def headers(self) -> dict[str, str]:
        # Every 503 says when to retry, whichever path answers it (the problem map, the call
        # that could not be recorded).
        return {"Retry-After": "1"}


class InternalError(Problem, slug="internal-error", status=500, title="Internal error"):
    """Something failed on our side. The body never carries tracebacks, SQL or driver text."""


# Safe retries and edits (issue 15): any operation declared `idempotent` or `conditional`
# (service/operations.py) can answer these, whatever its feature.


class IdempotencyKeyReused(
    Problem, slug="idempotency-key-reused", status=422, title="Idempotency key reused"
):
    """The `Idempotency-Key` answered another request (another body, route or operation) within
    its 24 hours. Nothing was written: send this request under a new key (or the first request
    again to get its answer)."""


class IdempotencyKeyInFlight(
    Problem, slug="idempotency-key-in-flight", status=409, title="Idempotency key in flight"
):
    """A request with this `Idempotency-Key` is still being carried out. Nothing was written:
    retry after `Retry-After` seconds to get its answer."""

    def headers(self) -> dict[str, str]:
        return {"Retry-After": "1"}


class IdempotencyAnswerGone(
    Problem, slug="idempotency-answer-gone", status=410, title="Idempotency answer gone"
):
    """The request with this `Idempotency-Key` was carried out, but a memory its answer named
    has since been deleted, retracted, revoked or erased, so the answer (which held its value)
    is no longer kept. Nothing was written; read the memories before writing under a new key."""


class PreconditionFailed(
    Problem, slug="precondition-failed", status=412, title="Precondition failed"
):
    """`If-Match` named a version that is no longer the live version of the memory's key (or
    `*`, and the key has no live version). Nothing was changed. `current_etag` is the ETag of
    the live version now (null: none you can see): read it, and resend with that ETag if your
    change still holds."""
