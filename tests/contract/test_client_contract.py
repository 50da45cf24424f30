"""The typed client (clients/python) is checked against openapi.yaml: every endpoint it calls
exists with its operationId, its request fields are the request schema's, its query names the
operation's parameters, its answer types name the answer schema's fields, and the sync and async
clients offer the same methods, named after the operationIds.

The client never imports the server, and this test reads only openapi.yaml (not the app): it is
the contract a client built elsewhere would be held to."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import memgate_client
import pytest
import yaml
from memgate_client import AsyncMemgate, ClientCredentials, Memgate, TokenExchange
from memgate_client import types as t
from memgate_client._endpoints import ENDPOINTS, Endpoint

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "clients" / "python"

ANSWERS: dict[str, Any] = {
    "MemoryOut": t.Memory,
    "MemoryWritten": t.MemoryWritten,
    "MemoryBatchWritten": t.BatchWritten,
    "Provenance": t.Provenance,
    "MemoryPage": t.MemoryPage,
    "MemoryHistory": t.MemoryPage,
    "SearchHit": t.SearchHit,
    "SearchResult": t.SearchResult,
    "MemoryCounts": t.MemoryCounts,
    "CountGroup": t.CountGroup,
    "AudienceNarrowing": t.AudienceNarrowing,
    "RevertNote": t.RevertNote,
    "HiddenNote": t.HiddenNote,
    "PrincipalOut": t.Principal,
    "ClientOut": t.Client,
    "ClientCreated": t.ClientCreated,
    "SpaceOut": t.Space,
    "SpaceCreated": t.SpaceCreated,
    "SpaceAccess": t.SpaceAccess,
    "SpaceSettings": t.SpaceSettings,
    "TeamOut": t.Team,
    "PolicyChange": t.PolicyChange,
    "RoleGrant": t.RoleGrant,
    "AuditEventOut": t.AuditEvent,
    "AuditPage": t.AuditPage,
    "VerifyOut": t.AuditVerification,
    "CheckpointVerdict": t.CheckpointVerdict,
    "CheckpointOut": t.Checkpoint,
    "RunOut": t.JobRun,
    "RunError": t.RunError,
    "RunPage": t.JobRunPage,
    "TenantOut": t.Tenant,
    "TenantAdmin": t.TenantAdmin,
    "TenantCreated": t.TenantCreated,
    "TenantPage": t.TenantPage,
    "TenantLimits": t.TenantLimits,
    "TenantUsage": t.TenantUsage,
    "Limits": t.Limits,
    "TokenResponse": t.TokenResponse,
}
"""The client's answer type for each answer schema of openapi.yaml."""


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "openapi.yaml").read_text())
    return loaded


def _fields(typed: Any) -> tuple[set[str], set[str]]:
    """(every key, the required keys) of a TypedDict."""
    required = set(typed.__required_keys__)
    return required | set(typed.__optional_keys__), required


def _schema(document: dict[str, Any], ref: str) -> dict[str, Any]:
    found: dict[str, Any] = document["components"]["schemas"][ref.rsplit("/", 1)[-1]]
    return found


def _operation(document: dict[str, Any], endpoint: Endpoint) -> dict[str, Any]:
    item = document["paths"].get(endpoint.path)
    assert item is not None, f"{endpoint.operation_id}: {endpoint.path} is not in openapi.yaml"
    operation = item.get(endpoint.method.lower())
    assert operation is not None, f"{endpoint.method} {endpoint.path} is not in openapi.yaml"
    found: dict[str, Any] = operation
    return found


def snake(operation_id: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", operation_id).lower()


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=lambda e: e.operation_id)
def test_every_endpoint_is_in_openapi_with_its_operation_id(
    document: dict[str, Any], endpoint: Endpoint
) -> None:
    operation = _operation(document, endpoint)
    assert operation["operationId"] == endpoint.operation_id
    declared = {p["name"] for p in operation.get("parameters", []) if p["in"] == "query"}
    assert set(endpoint.query) <= declared, set(endpoint.query) - declared
    in_path = {p["name"] for p in operation.get("parameters", []) if p["in"] == "path"}
    assert set(re.findall(r"{(\w+)}", endpoint.path)) == in_path
    assert endpoint.authenticated == (operation.get("security") != [])


@pytest.mark.parametrize(
    "endpoint",
    [e for e in ENDPOINTS if e.body is not None],
    ids=lambda e: e.operation_id,
)
def test_request_fields_are_the_request_schemas(
    document: dict[str, Any], endpoint: Endpoint
) -> None:
    content = _operation(document, endpoint)["requestBody"]["content"]
    schema = _schema(document, content["application/json"]["schema"]["$ref"])
    keys, required = _fields(endpoint.body)
    assert keys == set(schema["properties"]), keys ^ set(schema["properties"])
    assert required == set(schema.get("required", []))


def test_endpoints_without_a_body_send_none(document: dict[str, Any]) -> None:
    """A client endpoint without a body shape is an operation without a JSON body (or the
    token form, checked below)."""
    for endpoint in ENDPOINTS:
        if endpoint.body is None and not endpoint.form:
            assert "requestBody" not in _operation(document, endpoint), endpoint.operation_id


def test_token_forms_send_only_token_request_fields(document: dict[str, Any]) -> None:
    [issue] = [e for e in ENDPOINTS if e.form]
    content = _operation(document, issue)["requestBody"]["content"]
    schema = _schema(document, content["application/x-www-form-urlencoded"]["schema"]["$ref"])
    props = schema["properties"]
    user = ClientCredentials("id", "secret", scope=["read:memory"])
    forms = [user.form(), TokenExchange("agent", "secret", user, scope="read:memory").form("x")]
    for form in forms:
        assert set(form) <= set(props), set(form) - set(props)
        assert form["grant_type"] in props["grant_type"]["enum"]
    exchange = forms[1]
    assert exchange["subject_token_type"] in props["subject_token_type"]["enum"]
    assert exchange["requested_token_type"] in props["requested_token_type"]["enum"]


@pytest.mark.parametrize("name", sorted(ANSWERS))
def test_answer_types_name_the_answer_schemas_fields(document: dict[str, Any], name: str) -> None:
    schema = document["components"]["schemas"][name]
    keys, required = _fields(ANSWERS[name])
    assert keys == set(schema["properties"]), keys ^ set(schema["properties"])
    # A field the server may leave out is NotRequired in the client (its readers must check).
    assert required <= set(schema.get("required", [])) or name == "SpaceSettings"


def test_every_answer_schema_of_a_client_endpoint_has_its_type(document: dict[str, Any]) -> None:
    for endpoint in ENDPOINTS:
        for status, answer in _operation(document, endpoint)["responses"].items():
            if not status.startswith("2"):
                continue
            for body in answer.get("content", {}).values():
                ref = body.get("schema", {}).get("$ref")
                if ref is not None:
                    name = ref.rsplit("/", 1)[-1]
                    assert name in ANSWERS or name.endswith("List"), (endpoint, name)


def test_the_batch_write_is_keyed_and_retried() -> None:
    """The one POST the client retries carries an Idempotency-Key (docs/import-export.md)."""
    [batch] = [e for e in ENDPOINTS if e.operation_id == "writeMemoryBatch"]
    assert batch.keyed
    assert batch.retryable


def test_method_names_follow_operation_ids_in_both_clients() -> None:
    for endpoint in ENDPOINTS:
        name = snake(endpoint.operation_id)
        assert callable(getattr(Memgate, name, None)), f"Memgate.{name}"
        assert inspect.iscoroutinefunction(getattr(AsyncMemgate, name, None)), name


def test_sync_and_async_clients_have_the_same_signatures() -> None:
    public = {n for n in dir(AsyncMemgate) if not n.startswith("_")} - {"aclose"}
    assert public == {n for n in dir(Memgate) if not n.startswith("_")} - {"close"}
    for name in public:
        async_params = inspect.signature(getattr(AsyncMemgate, name)).parameters
        sync_params = inspect.signature(getattr(Memgate, name)).parameters
        assert list(async_params) == list(sync_params), name


def test_only_plain_writes_of_unkeyed_posts_are_never_retried() -> None:
    """The retry rule, as the table states it: GET/PUT/DELETE, the token form, the search (a
    read) and keyed POSTs; never another POST (a lost answer may hide a done write)."""
    retried = {e.operation_id for e in ENDPOINTS if e.retryable}
    posts = {e.operation_id for e in ENDPOINTS if e.method == "POST"}
    assert posts - retried >= {"writeMemory", "revertMemory", "createPrincipal", "startJobRun"}
    assert posts & retried == {"issueToken", "searchMemories", "writeMemoryBatch"}


def test_the_sync_client_is_generated_from_the_async_one() -> None:
    checked = subprocess.run(  # noqa: S603 (the repo's own script)
        [sys.executable, str(CLIENT / "unasync.py"), "--check"], check=False
    )
    assert checked.returncode == 0, "run: .venv/bin/python clients/python/unasync.py"


def test_the_client_never_imports_the_server() -> None:
    package = Path(memgate_client.__file__).parent
    for source in package.rglob("*.py"):
        text = source.read_text()
        assert not re.search(r"^\s*(from|import)\s+service\b", text, re.MULTILINE), source
