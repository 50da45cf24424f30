"""openapi.yaml is generated from the app and committed; any drift fails here. And it tells the
truth: explicit operation ids, the problems each operation declares (and only those) as
`application/problem+json`, `security: []` exactly on the public routes, the token form."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.app import create_app
from service.auth.exchange import TOKEN_EXCHANGE
from service.http.openapi_doc import SCHEMA_ROUTES, documented_problems, render_openapi
from service.jobs.platform import PLATFORM_JOBS
from service.jobs.registry import JOBS
from service.operations import OPERATIONS, Operation
from service.problems import PROBLEM_TYPES

ROOT = Path(__file__).resolve().parents[2]
METHODS = {"get", "put", "post", "delete", "patch"}
PROBES = {"checkLiveness", "checkReadiness"}
"""Not operations (no audit row, no token): the liveness and readiness probes."""
PUBLIC_TODAY = {
    ("post", "/oauth/token"),
    ("get", "/.well-known/jwks.json"),
    ("get", "/.well-known/oauth-authorization-server"),
    ("get", "/healthz"),
    ("get", "/readyz"),
    ("get", "/schema"),
    ("get", "/schema/openapi.json"),
    ("get", "/schema/openapi.yaml"),
}
"""Today's public routes, spelled out (more may be declared public; none of these may stop)."""

UNDOCUMENTED = {"mcpExchange", "finalizeErasure"}
"""Operations without an OpenAPI entry: the MCP endpoint is a mounted JSON-RPC app, whose tools
describe themselves (tools/list, docs/mcp.md); Litestar does not describe mounts. An erasure's
finalisation is a call the execute route starts after its answer (service/erasure), no route."""


JOB_OPERATIONS = {job.operation.operation_id for job in JOBS.values()} | {
    job.operation.operation_id for job in PLATFORM_JOBS.values()
}
"""Operations a job runs (service/jobs/registry.py, platform.py): tenant jobs are started
through `startJobRun` and platform jobs by `memgate jobs run`, each batch audited under the
job's operation, never a route of their own."""


def documented() -> list[Operation]:
    hidden = UNDOCUMENTED | JOB_OPERATIONS
    return [op for op in OPERATIONS.values() if op.operation_id not in hidden]


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "openapi.yaml").read_text())
    return loaded


def operations(document: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if method in METHODS:
                yield method, path, operation


def errors(operation: dict[str, Any]) -> dict[str, Any]:
    return {code: r for code, r in operation["responses"].items() if int(code) >= 400}


def test_committed_openapi_matches_the_app() -> None:
    committed = (ROOT / "openapi.yaml").read_text()
    assert committed == render_openapi(), "openapi.yaml drifted: run `memgate openapi`"


def test_every_problem_type_is_listed(document: dict[str, Any]) -> None:
    listed = {entry["type"] for entry in document["x-problem-types"]}
    assert listed == {cls.type_uri() for cls in PROBLEM_TYPES.values()}
    assert all(entry["description"] for entry in document["x-problem-types"])


def test_operation_ids_are_explicit_camel_case_and_cover_every_operation(
    document: dict[str, Any],
) -> None:
    ids = [operation["operationId"] for _, _, operation in operations(document)]
    assert len(ids) == len(set(ids))
    assert all(re.fullmatch(r"[a-z][a-zA-Z0-9]*", i) for i in ids), ids
    declared = {op.operation_id for op in documented()}
    schema_ids = {operation_id for operation_id, _ in SCHEMA_ROUTES.values()}
    assert set(ids) == declared | PROBES | schema_ids
    assert {"searchMemories", "writeMemory", "issueToken", "getMemory"} <= set(ids)


def test_exactly_the_public_routes_need_no_token(document: dict[str, Any]) -> None:
    public = {(m, p) for m, p, operation in operations(document) if operation["security"] == []}
    by_id = {operation["operationId"]: (m, p) for m, p, operation in operations(document)}
    expected = {
        by_id[operation_id]
        for operation_id in (
            {op.operation_id for op in documented() if op.public}
            | PROBES
            | {operation_id for operation_id, _ in SCHEMA_ROUTES.values()}
        )
    }
    assert public == expected
    assert public >= PUBLIC_TODAY
    assert ("post", "/v1/memories/search") not in public


def test_every_other_route_requires_a_bearer_token(document: dict[str, Any]) -> None:
    assert document["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert document["security"] == [{"bearer": []}]
    private = [
        (m, p, operation["security"])
        for m, p, operation in operations(document)
        if operation["security"] != []
    ]
    assert len(private) >= 30
    assert all(security == [{"bearer": []}] for _, _, security in private), private


def test_each_operation_lists_exactly_its_declared_problems(document: dict[str, Any]) -> None:
    declared = {op.operation_id: op for op in documented()}
    checked = 0
    for method, path, operation in operations(document):
        op = declared.get(operation["operationId"])
        if op is None:
            continue
        checked += 1
        problems = documented_problems(op, body="requestBody" in operation)
        listed = errors(operation)
        assert set(listed) == {str(p.status) for p in problems}, (method, path)
        for status, response in listed.items():
            assert response["content"] == {
                "application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}
            }
            assert set(response["x-problem-types"]) == {
                p.type_uri() for p in problems if str(p.status) == status
            }
            assert all(
                f"`{p.slug}`" in response["description"]
                for p in problems
                if str(p.status) == status
            )
    assert checked == len(declared)


def test_problems_an_operation_can_raise_are_listed(document: dict[str, Any]) -> None:
    by_id = {operation["operationId"]: operation for _, _, operation in operations(document)}
    search = errors(by_id["searchMemories"])
    assert {"400", "401", "403", "404", "415", "422", "502", "503"} <= set(search)
    assert "https://memgate.dev/problems/k-out-of-range" in search["422"]["x-problem-types"]
    assert "https://memgate.dev/problems/insufficient-scope" in search["403"]["x-problem-types"]
    assert not {"413", "415"} & set(errors(by_id["getMemory"]))  # no body to refuse
    # Public, no input but the query string: an unknown parameter, our failure, the audit log.
    assert set(errors(by_id["getJwks"])) == {"422", "500", "503"}
    assert {"401", "403", "500"} <= set(search)


def test_no_operation_advertises_litestars_validation_body(document: dict[str, Any]) -> None:
    """Litestar documents a 400 `{status_code, detail, extra}` body the API never sends."""
    for method, path, operation in operations(document):
        for status, response in errors(operation).items():
            for content in response.get("content", {}).values():
                properties = set(content["schema"].get("properties", {}))
                assert not properties & {"status_code", "extra"}, (method, path, status)
            assert "Validation Exception" not in str(response), (method, path, status)
    readyz = errors(document["paths"]["/readyz"]["get"])
    assert set(readyz) == {"422", "503"}  # not ready: `{"status": "not ready"}`, not a problem


def test_the_token_endpoint_describes_its_form_and_answer(document: dict[str, Any]) -> None:
    token = document["paths"]["/oauth/token"]["post"]
    form_ref = token["requestBody"]["content"]["application/x-www-form-urlencoded"]["schema"]
    schemas = document["components"]["schemas"]
    form = schemas[form_ref["$ref"].rsplit("/", 1)[1]]
    assert form["required"] == ["grant_type"]
    assert form["properties"]["grant_type"]["enum"] == ["client_credentials", TOKEN_EXCHANGE]
    assert {"client_id", "client_secret", "scope", "subject_token", "subject_token_type"} <= set(
        form["properties"]
    )
    answer_ref = token["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    answer = schemas[answer_ref.rsplit("/", 1)[1]]
    assert {"access_token", "token_type", "expires_in", "scope"} <= set(answer["required"])
    assert (
        "https://memgate.dev/problems/oauth-invalid-client"
        in (token["responses"]["401"]["x-problem-types"])
    )
    assert (
        "https://memgate.dev/problems/oauth-too-many-failures"
        in (token["responses"]["429"]["x-problem-types"])
    )


def test_the_document_is_built_from_the_apps_handlers() -> None:
    """An app route whose operation id is not declared cannot be documented (nor served)."""
    app = create_app()
    ids = {
        handler.operation_id
        for route in app.routes
        for handler in getattr(route, "route_handlers", [])
        if isinstance(handler.operation_id, str)
    }
    assert ids >= {op.operation_id for op in documented()}


MOUNTED_UNDOCUMENTED = {("asgi", "/mcp")}
"""Served, not in the document: the MCP endpoint, a mounted app (UNDOCUMENTED above)."""


def _served(app: Any) -> set[tuple[str, str]]:
    """(method, path) of every route the app serves, HEAD and OPTIONS aside; ("asgi", path)
    for a mounted app, which takes every method."""
    served = set()
    for route in app.routes:
        path = re.sub(r"\{(\w+):\w+\}", r"{\1}", route.path)
        methods = {m.lower() for m in getattr(route, "methods", ())} & METHODS
        served |= {(method, path) for method in methods} or {("asgi", path)}
    return served


def test_every_served_route_is_documented_and_every_documented_one_served(
    document: dict[str, Any],
) -> None:
    """Issue 18, inventory: the set of (method, path) the app mounts equals the document's,
    but for the MCP endpoint; a route served without a description, or a description of a
    route gone, fails here by name."""
    served = _served(create_app())
    described = {(method, path) for method, path, _ in operations(document)}
    assert served - described - MOUNTED_UNDOCUMENTED == set()
    assert described - served == set()
    assert MOUNTED_UNDOCUMENTED & served  # the exception is a real route
