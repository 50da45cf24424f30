"""The one exception map: everything leaves as `application/problem+json`."""

from __future__ import annotations

from typing import Any

import structlog
from litestar import Request, Response
from litestar.exceptions import (
    HTTPException,
    MethodNotAllowedException,
    NotFoundException,
    ValidationException,
)
from litestar.status_codes import HTTP_413_REQUEST_ENTITY_TOO_LARGE
from sqlalchemy.exc import DataError, DBAPIError

from service.db.driver import QUERY_CANCELED
from service.db.types import PATTERN_MEANINGS
from service.http.audit import find_call
from service.problems import (
    BodyTooLarge,
    InternalError,
    InvalidRequest,
    MalformedId,
    MalformedRequest,
    MethodNotAllowed,
    Problem,
    RouteNotFound,
    ServiceUnavailable,
)

PROBLEM_JSON = "application/problem+json"
_log = structlog.get_logger("memgate.errors")


def problem_response(problem: Problem, request: Request[Any, Any, Any]) -> Response[Any]:
    return Response(
        problem.to_body(instance=request.url.path),
        status_code=problem.status,
        media_type=PROBLEM_JSON,
        headers=problem.headers(),
    )


def _readable(message: str) -> str:
    """msgspec names a failed pattern by its regex; say what the known ones mean."""
    for pattern, meaning in PATTERN_MEANINGS.items():
        message = message.replace(f"`str` matching regex {pattern!r}", meaning)
    return message


def _validation_problem(exc: ValidationException) -> Problem:
    errors: list[dict[str, Any]] = []
    for item in exc.extra or []:
        if isinstance(item, dict):
            errors.append(
                {
                    "field": item.get("key") or "body",
                    "source": item.get("source", "body"),
                    "message": _readable(str(item.get("message", ""))),
                }
            )
    detail_text = str(exc.detail or "")
    if not errors and "JSON" in detail_text:
        return MalformedRequest(
            "The request body is not valid JSON. Send a JSON object with "
            "'Content-Type: application/json'."
        )
    if errors and all(e["message"].startswith("Invalid UUID") for e in errors):
        # One answer for a malformed id wherever it is (path, query or body): 400 malformed-id.
        fields = ", ".join(e["field"] for e in errors)
        return MalformedId(
            f"{fields}: not a UUID. Ids look like 0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b.",
            errors=errors,
        )
    summary = "; ".join(f"{e['field']}: {e['message']}" for e in errors) or detail_text
    return InvalidRequest(f"The request did not validate: {summary}", errors=errors)


def to_problem(exc: Exception) -> Problem:
    if isinstance(exc, Problem):
        return exc
    if isinstance(exc, DataError):
        # The database refused a value the validators let through. Still the caller's input,
        # and the transaction was rolled back; the driver's words (which quote SQL) stay out.
        return InvalidRequest(
            "A value could not be stored: look for NUL characters or out-of-range dates "
            "and numbers.",
            errors=[],
        )
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        # A restart or failover: the pool has retired its connections, so a retry gets a new
        # one. Whether a commit in flight landed is unknown: a write retries safely with its
        # Idempotency-Key.
        return ServiceUnavailable(
            "The database connection was lost (a restart or failover). Retry the request; "
            "retry a write with the same Idempotency-Key."
        )
    if isinstance(exc, DBAPIError) and getattr(exc.orig, "sqlstate", None) == QUERY_CANCELED:
        # MEMGATE_DB_STATEMENT_TIMEOUT_MS ended a statement (most often a wait for a lock a
        # stuck transaction holds); the transaction was rolled back. Reads of memories have
        # their own budget and answer a problem of their own before this.
        return ServiceUnavailable(
            "A database statement took longer than the server allows and was stopped; "
            "nothing was changed. Retry; retry a write with the same Idempotency-Key."
        )
    if isinstance(exc, RecursionError):
        return MalformedRequest("The JSON body is nested too deeply.")
    if isinstance(exc, ValidationException):
        return _validation_problem(exc)
    if isinstance(exc, NotFoundException):
        return RouteNotFound("No route matches this path. See /schema for the API.")
    if isinstance(exc, MethodNotAllowedException):
        return MethodNotAllowed(f"{exc.detail}. See /schema for the allowed methods.")
    if isinstance(exc, HTTPException) and exc.status_code == HTTP_413_REQUEST_ENTITY_TOO_LARGE:
        return BodyTooLarge("The request body is larger than the server accepts.")
    if isinstance(exc, HTTPException) and exc.status_code < 500:
        return MalformedRequest(str(exc.detail))
    return InternalError("Something failed on our side; it was logged. Retry later.")


def handle_exception(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    problem = to_problem(exc)
    call = find_call(request.scope)
    if call is not None:
        call.facts.reason = problem.audit_reason()
    if problem.status >= 500 and not isinstance(exc, Problem):
        # Exception type only: messages of driver errors can carry SQL and values.
        _log.error("unhandled_error", error_type=type(exc).__name__)
    return problem_response(problem, request)
