"""Render `openapi.yaml` from the app itself (a contract test fails when the file drifts)."""

from __future__ import annotations

from typing import Any

import yaml

from service.problems import PROBLEM_TYPES


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


def render_openapi() -> str:
    from service.app import create_app

    # Importing the app registers every feature's problem types.
    document: dict[str, Any] = create_app().openapi_schema.to_schema()
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
    document["x-problem-types"] = problem_catalogue()
    return yaml.safe_dump(document, sort_keys=True, allow_unicode=True)
