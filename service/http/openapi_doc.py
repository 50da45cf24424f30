"""The OpenAPI document: rendered into `openapi.yaml` (a contract test fails when the file
drifts) and served at `/schema`, `/schema/openapi.json` and `/schema/openapi.yaml`.

What is served is exactly the committed document, and those three routes are described in it;
any other `/schema/...` path is the usual problem+json 404 (Litestar's OpenAPI router would
answer it with an HTML page).
"""

from __future__ import annotations

import json
from typing import Any

import yaml
from litestar import Litestar, Request, Router
from litestar.openapi.plugins import JsonRenderPlugin, YamlRenderPlugin

from service.problems import PROBLEM_TYPES

_DOCUMENT = "memgate.openapi_document"
"""Key in `app.state`: the rendered document, built once per app."""

SCHEMA_ROUTES = {
    "/schema": ("GetSchema", "application/vnd.oai.openapi+json"),
    "/schema/openapi.json": ("GetSchemaOpenapiJson", "application/vnd.oai.openapi+json"),
    "/schema/openapi.yaml": ("GetSchemaOpenapiYaml", "application/vnd.oai.openapi"),
}
"""Path → (operation id, media type) of the routes serving this document."""


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
                }
            },
        }
    }


def openapi_document(app: Litestar) -> dict[str, Any]:
    """The document of `app`: Litestar's schema plus the problem catalogue and the schema
    routes themselves."""
    document: dict[str, Any] = app.openapi_schema.to_schema()
    document.setdefault("components", {}).setdefault("schemas", {})["Problem"] = {
        "type": "object",
        "description": "RFC 9457 problem details (media type application/problem+json).",
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
