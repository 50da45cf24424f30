"""The OpenAPI document: rendered into `openapi.yaml` (a contract test fails when the file
drifts) and served at `/schema`, `/schema/openapi.json` and `/schema/openapi.yaml`.

Litestar's generated schema is corrected from the operation declarations
(service/operations.py), matched by operation id: each operation lists exactly the problems
`Operation.all_problems()` names, one `application/problem+json` response per status (Litestar's
own 400 `ValidationException` body, which the API never sends, is dropped); public operations
and the probes say `security: []`, every other one the bearer scheme; the token endpoint's form
body and answer, which its handler parses and builds by hand, are described here.

What is served is exactly the committed document, and those three routes are described in it;
any other `/schema/...` path is the usual problem+json 404 (Litestar's OpenAPI router would
answer it with an HTML page).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from typing import Any

import yaml
from litestar import Litestar, Request, Router
from litestar.openapi.plugins import JsonRenderPlugin, YamlRenderPlugin

from service.auth.exchange import ACCESS_TOKEN_TYPE, TOKEN_EXCHANGE
from service.auth.operations import TOKEN
from service.auth.scopes import ALL_SCOPES
from service.http.audit import EXEMPT
from service.operations import OPERATIONS, Operation
from service.problems import (
    PROBLEM_TYPES,
    BodyTooLarge,
    InvalidRequest,
    Problem,
    ServiceUnavailable,
    UnsupportedMediaType,
)

_DOCUMENT = "memgate.openapi_document"
"""Key in `app.state`: the rendered document, built once per app."""

SCHEMA_ROUTES = {
    "/schema": ("getSchema", "application/vnd.oai.openapi+json"),
    "/schema/openapi.json": ("getSchemaJson", "application/vnd.oai.openapi+json"),
    "/schema/openapi.yaml": ("getSchemaYaml", "application/vnd.oai.openapi"),
}
"""Path → (operation id, media type) of the routes serving this document."""

PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}
BEARER: list[dict[str, list[str]]] = [{"bearer": []}]
OPERATION_ID = re.compile(r"^[a-z][a-zA-Z0-9]*$")
"""Operation ids are explicit camelCase verbs (`searchMemories`), never generated from paths."""
_UNAUDITED: tuple[type[Problem], ...] = (InvalidRequest,)
"""What a probe can answer besides its own body: an unknown query parameter."""
_SCHEMA_PROBLEMS: tuple[type[Problem], ...] = (InvalidRequest, ServiceUnavailable)
"""The schema routes are audited (`schema.read`): an audit log that cannot record is 503."""
_BODY_PROBLEMS = (UnsupportedMediaType, BodyTooLarge)
_METHODS = ("get", "put", "post", "delete", "patch", "head", "options")


def problem_catalogue() -> list[dict[str, Any]]:
    return [
        {
            "type": cls.type_uri(),
            "status": cls.status,
            "title": cls.title,
            "description": " ".join((cls.__doc__ or "").split()),
        }
        for slug, cls in sorted(PROBLEM_TYPES.items())
    ]


def _schema_operation(operation_id: str, media_type: str) -> dict[str, Any]:
    return {
        "get": {
            "operationId": operation_id,
            "summary": "This OpenAPI document",
            "description": (
                "The API's OpenAPI document (this one), without a token. "
                + ("JSON." if "json" in media_type else "YAML.")
            ),
            "tags": ["operations"],
            "security": [],
            "responses": {
                "200": {
                    "description": "The document",
                    "content": {media_type: {"schema": {"type": "object"}}},
                },
                **problem_responses(_SCHEMA_PROBLEMS),
            },
        }
    }


PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": (
        "RFC 9457 problem details (media type application/problem+json). `type` is one of "
        "x-problem-types; a problem may carry more members (`errors`, `retry_after`, and on "
        "the token endpoint RFC 6749's `error` and `error_description`)."
    ),
    "required": ["type", "title", "status", "detail"],
    "properties": {
        "type": {"type": "string", "format": "uri"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "instance": {"type": "string"},
    },
    "additionalProperties": True,
}


def problem_responses(problems: tuple[type[Problem], ...]) -> dict[str, Any]:
    """One response per status, each naming the problem types it can be."""
    by_status: dict[int, list[type[Problem]]] = defaultdict(list)
    for problem in problems:
        by_status[problem.status].append(problem)
    responses: dict[str, Any] = {}
    for status in sorted(by_status):
        kinds = sorted(by_status[status], key=lambda kind: kind.slug)
        responses[str(status)] = {
            "description": "; ".join(f"`{kind.slug}`: {kind.title}" for kind in kinds),
            "content": {"application/problem+json": {"schema": PROBLEM_REF}},
            "x-problem-types": [kind.type_uri() for kind in kinds],
        }
    return responses


def documented_problems(declared: Operation, *, body: bool) -> tuple[type[Problem], ...]:
    """What the document lists for `declared`: all its problems, but a route that takes no
    request body never answers 413 or 415 (its body is never read)."""
    problems = declared.all_problems()
    if body:
        return problems
    return tuple(problem for problem in problems if problem not in _BODY_PROBLEMS)


def _declare(operation: dict[str, Any], declared: Operation) -> None:
    """The declaration's problems replace every error response Litestar generated."""
    responses = operation.setdefault("responses", {})
    for status in [status for status in responses if int(status) >= 400]:
        del responses[status]
    problems = documented_problems(declared, body="requestBody" in operation)
    responses.update(problem_responses(problems))
    operation["security"] = [] if declared.public else BEARER


TOKEN_FORM: dict[str, Any] = {
    "type": "object",
    "description": (
        "RFC 6749 §4.4 client credentials, or RFC 8693 token exchange. Each parameter at most "
        "once. The client authenticates with HTTP Basic (client_secret_basic) or with "
        "client_id and client_secret in this form (client_secret_post), not both."
    ),
    "required": ["grant_type"],
    "properties": {
        "grant_type": {"type": "string", "enum": ["client_credentials", TOKEN_EXCHANGE]},
        "client_id": {"type": "string", "description": "With client_secret_post."},
        "client_secret": {"type": "string", "description": "With client_secret_post."},
        "scope": {
            "type": "string",
            "description": (
                "Space-separated scopes; the answer's `scope` says what was granted (requested ∩ "
                "registered, and ∩ the user's token for an exchange). None: all registered. "
                "Known scopes: " + ", ".join(sorted(ALL_SCOPES)) + "."
            ),
        },
        "subject_token": {
            "type": "string",
            "description": "Token exchange: the user's access token the agent acts for.",
        },
        "subject_token_type": {
            "type": "string",
            "enum": [ACCESS_TOKEN_TYPE],
            "description": "Token exchange: required.",
        },
        "requested_token_type": {
            "type": "string",
            "enum": [ACCESS_TOKEN_TYPE],
            "description": "Token exchange: only access tokens are issued (`actor_token` is "
            "refused: the acting agent is the authenticated client).",
        },
    },
}

TOKEN_ANSWER: dict[str, Any] = {
    "type": "object",
    "required": ["access_token", "token_type", "expires_in", "scope", "issued_token_type"],
    "properties": {
        "access_token": {"type": "string", "description": "A signed `at+jwt`."},
        "token_type": {"type": "string", "enum": ["Bearer"]},
        "expires_in": {"type": "integer", "description": "Seconds until it expires."},
        "scope": {"type": "string", "description": "The scopes granted, space-separated."},
        "issued_token_type": {"type": "string", "enum": [ACCESS_TOKEN_TYPE]},
    },
}


def _describe_token_endpoint(operation: dict[str, Any]) -> None:
    operation["requestBody"] = {
        "required": True,
        "content": {
            "application/x-www-form-urlencoded": {
                "schema": {"$ref": "#/components/schemas/TokenRequest"}
            }
        },
    }
    operation["responses"]["200"] = {
        "description": "The access token (never cached: `Cache-Control: no-store`)",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/TokenResponse"}}},
    }


def _handlers_by_id(app: Litestar) -> dict[str, Any]:
    return {
        handler.operation_id: handler
        for route in app.routes
        for handler in getattr(route, "route_handlers", [])
        if isinstance(handler.operation_id, str)
    }


def _correct(document: dict[str, Any], app: Litestar) -> None:
    declared = {op.operation_id: op for op in OPERATIONS.values()}
    handlers = _handlers_by_id(app)
    for path, item in document["paths"].items():
        for method in _METHODS:
            operation = item.get(method)
            if operation is None:
                continue
            operation_id = operation.get("operationId", "")
            if not OPERATION_ID.match(operation_id):
                raise RuntimeError(
                    f"{method.upper()} {path}: operation id {operation_id!r} is not camelCase"
                )
            if operation_id == TOKEN.operation_id:
                _describe_token_endpoint(operation)
            if operation_id in declared:
                _declare(operation, declared[operation_id])
            elif operation_id in handlers and handlers[operation_id].opt.get(EXEMPT):
                # A probe: anyone who reaches the listener; only the query can be refused.
                operation["security"] = []
                operation["responses"].update(problem_responses(_UNAUDITED))
            else:
                raise RuntimeError(f"{method.upper()} {path}: {operation_id!r} is not an operation")


def openapi_document(app: Litestar) -> dict[str, Any]:
    """The document of `app`: Litestar's schema corrected from the operation declarations, plus
    the problem catalogue and the schema routes themselves."""
    document: dict[str, Any] = app.openapi_schema.to_schema()
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    schemas["Problem"] = PROBLEM_SCHEMA
    schemas["TokenRequest"] = TOKEN_FORM
    schemas["TokenResponse"] = TOKEN_ANSWER
    _correct(document, app)
    paths = document.setdefault("paths", {})
    for path, (operation_id, media_type) in SCHEMA_ROUTES.items():
        paths[path] = _schema_operation(operation_id, media_type)
    document["x-problem-types"] = problem_catalogue()
    # Plain data, as the committed YAML holds it (no tuples, no custom types).
    loaded: dict[str, Any] = json.loads(json.dumps(document))
    return loaded


def _served(app: Litestar) -> dict[str, Any]:
    document: dict[str, Any] | None = app.state.get(_DOCUMENT)
    if document is None:
        document = openapi_document(app)
        app.state[_DOCUMENT] = document
    return document


class SpecJson(JsonRenderPlugin):
    """`/schema` and `/schema/openapi.json`: the committed document as JSON."""

    def __init__(self) -> None:
        super().__init__(path=["/", "/openapi.json"])

    def render(self, request: Request[Any, Any, Any], openapi_schema: dict[str, Any]) -> bytes:
        return json.dumps(_served(request.app), sort_keys=True).encode()

    def receive_router(self, router: Router) -> None:
        # Litestar adds a catch-all `/schema/{path}` answering HTML; without it an unknown
        # schema path is an unmatched route, which our problem map answers as JSON.
        router.routes[:] = [route for route in router.routes if "{path" not in route.path]
        for route in router.routes:
            for handler in getattr(route, "route_handlers", []):
                # Declared where the recorder would infer it (service/http/audit.py).
                handler.opt.setdefault("action", "schema.read")


class SpecYaml(YamlRenderPlugin):
    """`/schema/openapi.yaml`: the committed document, byte for byte."""

    def __init__(self) -> None:
        super().__init__(path="/openapi.yaml")

    def render(self, request: Request[Any, Any, Any], openapi_schema: dict[str, Any]) -> bytes:
        return _yaml(_served(request.app)).encode()


def _yaml(document: dict[str, Any]) -> str:
    return yaml.safe_dump(document, sort_keys=True, allow_unicode=True)


def render_openapi() -> str:
    from service.app import create_app

    # Importing the app registers every feature's problem types.
    return _yaml(openapi_document(create_app()))
