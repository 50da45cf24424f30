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


IDEMPOTENCY_KEY_PARAMETER: dict[str, Any] = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "description": "1-200 visible ASCII characters (a UUID will do). The same key with the same "
    "request (route, body, If-Match) within 24 hours answers the first answer again "
    "(`Idempotent-Replayed: true`), changing nothing; with another request 422 "
    "`idempotency-key-reused`; while the first call runs 409 `idempotency-key-in-flight`.",
    "schema": {"type": "string", "minLength": 1, "maxLength": 200},
}
"""Every idempotent operation takes it: the route hooks handle it, not the handler."""


def _declare(operation: dict[str, Any], declared: Operation) -> None:
    """The declaration's problems replace every error response Litestar generated; an
    idempotent operation's `Idempotency-Key` header is listed."""
    if declared.idempotent:
        operation["parameters"] = [*operation.get("parameters", []), IDEMPOTENCY_KEY_PARAMETER]
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


# --- The API reference in Markdown (docs/api.md) ------------------------------------------------

API_REFERENCE = "docs/api.md"
"""Where `memgate openapi --markdown` writes the reference by default; a contract test
compares the committed file with a fresh render."""
_TAG_ORDER = ("memories", "policy", "admin", "audit", "jobs", "platform", "oauth", "operations")
"""Tags in the order a reader meets them (the quickstart's order); any other tag follows,
alphabetically, so a new feature's tag shows up without touching this list."""
_SCHEMA_PREFIX = "#/components/schemas/"


def _schema_name(schema: dict[str, Any]) -> str:
    """A schema as the reference names it: its component name, else its JSON type."""
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith(_SCHEMA_PREFIX):
        return f"`{ref.removeprefix(_SCHEMA_PREFIX)}`"
    if schema.get("type") == "array":
        return f"list of {_schema_name(schema.get('items', {}))}"
    return f"`{schema.get('type', 'any')}`"


def _bodies(content: dict[str, Any] | None) -> str:
    if not content:
        return "no body"
    return "; ".join(
        f"{_schema_name(media.get('schema', {}))} ({media_type})"
        for media_type, media in sorted(content.items())
    )


def _scope_line(operation: dict[str, Any], declared: Operation | None) -> str:
    if operation.get("security") == []:
        return "none (public: no token)"
    if declared is None or declared.scope is None:
        return "any valid bearer token"
    line = f"`{declared.scope}`"
    if declared.check is not None:
        line += f", then the policy check `{declared.check.__name__}`"
    return line


def _parameters(operation: dict[str, Any]) -> str:
    named = [
        f"`{p['name']}` ({p['in']}{', required' if p.get('required') else ''})"
        for p in operation.get("parameters", [])
    ]
    return ", ".join(named) or "none"


def _problems(operation: dict[str, Any]) -> str:
    listed = [
        f"{status} [`{uri.rsplit('/', 1)[-1]}`](#problem-{uri.rsplit('/', 1)[-1]})"
        for status, answer in sorted(operation["responses"].items())
        if int(status) >= 400
        for uri in answer.get("x-problem-types", [])
    ]
    return ", ".join(listed) or "none"


def _answers(operation: dict[str, Any]) -> str:
    return "; ".join(
        f"{status} {_bodies(answer.get('content'))}"
        for status, answer in sorted(operation["responses"].items())
        if int(status) < 400
    )


def _entry(method: str, path: str, operation: dict[str, Any], declared: Operation | None) -> str:
    request = operation.get("requestBody", {}).get("content")
    lines = [
        f"### `{operation['operationId']}`",
        "",
        f"`{method.upper()} {path}` — {operation.get('summary', '')}",
        "",
        f"- scope: {_scope_line(operation, declared)}",
        *([f"- audit action: `{declared.name}`"] if declared is not None else []),
        f"- parameters: {_parameters(operation)}",
        f"- request: {_bodies(request) if request else 'no body'}",
        f"- answer: {_answers(operation)}",
        f"- problems: {_problems(operation)}",
    ]
    description = " ".join(str(operation.get("description", "")).split())
    if description:
        lines += ["", description]
    return "\n".join(lines)


def _by_tag(document: dict[str, Any]) -> dict[str, list[tuple[str, str, dict[str, Any]]]]:
    tagged: dict[str, list[tuple[str, str, dict[str, Any]]]] = defaultdict(list)
    for path, item in sorted(document["paths"].items()):
        for method in _METHODS:
            operation = item.get(method)
            if operation is not None:
                tag = (operation.get("tags") or ["untagged"])[0]
                tagged[tag].append((method, path, operation))
    known = [tag for tag in _TAG_ORDER if tag in tagged]
    order = known + sorted(tag for tag in tagged if tag not in _TAG_ORDER)
    return {tag: tagged[tag] for tag in order}


def _problem_catalogue(document: dict[str, Any]) -> list[str]:
    lines = ["## Problem types", "", "| slug | status | title | when |", "|---|---|---|---|"]
    for entry in sorted(document.get("x-problem-types", []), key=lambda e: e["type"]):
        slug = entry["type"].rsplit("/", 1)[-1]
        when = entry["description"].replace("|", "\\|")
        lines.append(
            f'| <a id="problem-{slug}"></a>`{slug}` | {entry["status"]} | {entry["title"]} '
            f"| {when} |"
        )
    return lines


def api_reference(document: dict[str, Any]) -> str:
    """docs/api.md from an OpenAPI document (the one `render_openapi` writes): per tag, each
    operation's method, path, scope (from its declaration in service/operations.py), summary,
    request and answer schema names and the problems it can answer; then the problem types."""
    declared = {op.operation_id: op for op in OPERATIONS.values()}
    tagged = _by_tag(document)
    lines = [
        "# API reference",
        "",
        "<!-- Generated from openapi.yaml by `memgate openapi --markdown docs/api.md`; do not "
        "edit by hand (tests/contract/test_api_reference.py fails when it drifts). -->",
        "",
        f"{document['info']['title']} {document['info']['version']}: "
        f"{' '.join(str(document['info'].get('description', '')).split())}",
        "",
        "Every route below is also in [`openapi.yaml`](../openapi.yaml) (served at `/schema`), "
        "with the full request and answer schemas. A scope is the token's ceiling; the policy "
        "decides inside it ([concepts.md](concepts.md)). Every error is "
        "`application/problem+json` with a `type` from the table at the end. The MCP tools at "
        "`/mcp` are the same operations and are described in [mcp.md](mcp.md).",
        "",
    ]
    for tag, entries in tagged.items():
        lines.append(
            f"- [{tag}](#{tag}): " + ", ".join(f"`{op['operationId']}`" for _, _, op in entries)
        )
    for tag, entries in tagged.items():
        lines += ["", f"## {tag}", "", "| operation | method and path | scope |", "|---|---|---|"]
        for method, path, operation in entries:
            scope = _scope_line(operation, declared.get(operation["operationId"]))
            lines.append(
                f"| [`{operation['operationId']}`](#{operation['operationId'].lower()}) "
                f"| `{method.upper()} {path}` | {scope} |"
            )
        for method, path, operation in entries:
            lines += ["", _entry(method, path, operation, declared.get(operation["operationId"]))]
    lines += ["", *_problem_catalogue(document)]
    return "\n".join(lines) + "\n"
