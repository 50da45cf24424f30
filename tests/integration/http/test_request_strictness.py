"""Review item 22: the API is strict in every part of a request, and each refusal is a problem a
model can act on (which field or parameter, what is allowed) that changes nothing."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.settings import ServerSettings
from tests.fixtures.api import Api
from tests.integration.mcp.support import serving
from tests.integration.memory.support import assert_problem, count_memories, scalar

VALID = {"subject": "service:billing", "kind": "fact", "key": "strict.input", "value": "v"}
SEARCH = "/v1/memories/search"
MAX_BODY = ServerSettings().max_body_bytes
MODES = ("hybrid", "vector", "lexical")
NIL = "0190f0e0-aaaa-7bbb-8ccc-123456789abc"
COMMITTED: dict[str, Any] = yaml.safe_load(
    (Path(__file__).resolve().parents[3] / "openapi.yaml").read_text()
)


@dataclass(frozen=True)
class Case:
    name: str
    method: str
    path: str
    status: int
    slug: str
    body: bytes | None = None
    content_type: str | None = "application/json"
    field: str | None = None  # named in `errors` and in `detail`
    mentions: tuple[str, ...] = ()  # each appears in `detail`

    def __str__(self) -> str:
        return self.name


def _json(payload: object) -> bytes:
    return json.dumps(payload).encode()


CASES = (
    # A JSON body must say it is JSON: text/plain and forms were stored before.
    Case("json-as-text-plain", "POST", "/v1/memories", 415, "unsupported-media-type",
         _json(VALID), "text/plain", mentions=("application/json", "text/plain")),
    Case("json-as-form", "POST", "/v1/memories", 415, "unsupported-media-type",
         _json(VALID), "application/x-www-form-urlencoded", mentions=("application/json",)),
    Case("form-body", "POST", "/v1/memories", 415, "unsupported-media-type",
         b"subject=service:billing&kind=fact&key=strict.input&value=v",
         "application/x-www-form-urlencoded", mentions=("application/json",)),
    Case("json-without-content-type", "POST", SEARCH, 415, "unsupported-media-type",
         _json({"query": "q"}), None, mentions=("application/json",)),
    Case("json-latin1-charset", "POST", "/v1/memories", 415, "unsupported-media-type",
         _json(VALID), "application/json; charset=latin-1", mentions=("utf-8",)),
    # Unknown query parameters are refused like unknown JSON fields.
    Case("unknown-query-on-write", "POST", "/v1/memories?dry_run=1", 422, "invalid-request",
         _json(VALID), field="dry_run", mentions=("no query parameters",)),
    Case("unknown-query-on-list", "GET", "/v1/memories?colour=red&limit=5", 422,
         "invalid-request", None, None, field="colour", mentions=("limit", "cursor")),
    Case("unknown-query-on-search", "POST", f"{SEARCH}?k=3", 422, "invalid-request",
         _json({"query": "q"}), field="k"),
    # Text that carries nothing, or NUL, is refused where it is the content.
    Case("whitespace-value", "POST", "/v1/memories", 422, "invalid-request",
         _json(VALID | {"value": " \t\n "}), field="value",
         mentions=("non-space character",)),
    Case("whitespace-query", "POST", SEARCH, 422, "invalid-request",
         _json({"query": "   "}), field="query"),
    Case("nul-in-query", "POST", SEARCH, 422, "invalid-request",
         _json({"query": "a\u0000b"}), field="query", mentions=("no NUL",)),
    # A malformed id is 400 malformed-id wherever it is: path, query or body.
    Case("malformed-id-in-path", "GET", "/v1/memories/not-a-uuid", 400, "malformed-id", None,
         None),
    Case("malformed-id-in-query", "GET", "/v1/memories?space_id=nope", 400, "malformed-id",
         None, None, field="space_id"),
    Case("malformed-id-in-body", "POST", "/v1/memories", 400, "malformed-id",
         _json(VALID | {"space_id": "nope"}), field="space_id"),
    Case("malformed-id-in-body-list", "POST", "/v1/memories", 400, "malformed-id",
         _json(VALID | {"derived_from": [NIL, "nope"]}), field="derived_from[1]"),
    Case("malformed-id-in-search-filter", "POST", SEARCH, 400, "malformed-id",
         _json({"query": "q", "filters": {"space_id": "nope"}}), field="filters.space_id"),
    # A lone surrogate is named as what it is (it was "Input data was truncated").
    Case("lone-high-surrogate", "POST", "/v1/memories", 400, "malformed-request",
         b'{"subject":"service:billing","kind":"fact","key":"strict.input","value":"a\\ud800"}',
         mentions=("surrogate", "\\ud800")),
    Case("lone-low-surrogate", "POST", SEARCH, 400, "malformed-request",
         b'{"query":"\\udc00 x"}', mentions=("surrogate",)),
)  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=str)
async def test_a_strict_refusal_names_the_part_and_changes_nothing(api: Api, case: Case) -> None:
    alice = await api.new_agent("alice")
    await api.remember(alice, key="existing", value="already here")
    before = await count_memories(api.runtime)
    headers = {"Authorization": alice.headers["Authorization"]}
    if case.content_type is not None:
        headers["Content-Type"] = case.content_type
    response = await api.http.request(case.method, case.path, content=case.body, headers=headers)
    problem = assert_problem(response, case.status, case.slug)
    if case.field is not None:
        assert case.field in {error["field"] for error in problem.get("errors", [])}, problem
        assert case.field in problem["detail"], problem
    for text in case.mentions:
        assert text in problem["detail"], problem
    assert await count_memories(api.runtime) == before


async def test_valid_requests_still_work(api: Api) -> None:
    alice = await api.new_agent("alice")
    headers = {"Authorization": alice.headers["Authorization"]}
    for content_type in ("application/json", "application/json; charset=utf-8",
                         "Application/JSON;charset=UTF-8"):  # fmt: skip
        written = await api.http.post(
            "/v1/memories",
            # Three distinct facts of one subject: `new_key` takes them past the write gate.
            content=_json(
                VALID | {"key": f"ok.{len(content_type)}", "value": "  padded  ", "new_key": True}
            ),
            headers=headers | {"Content-Type": content_type},
        )
        assert written.status_code == 201, written.text
    listed = await api.http.get(
        "/v1/memories", params={"limit": 5, "kind": "fact"}, headers=alice.headers
    )
    assert listed.status_code == 200, listed.text
    assert len(listed.json()["items"]) == 3
    found = await api.search(alice, "padded", k=2)
    assert found.status_code == 200, found.text


@pytest.mark.parametrize(
    "path", ["/schema/swagger", "/schema/redoc", "/schema/openapi.yml", "/schema/nothing.json"]
)
async def test_unknown_schema_paths_are_problem_404s(api: Api, path: str) -> None:
    response = await api.http.get(path)
    assert_problem(response, 404, "route-not-found")
    assert "<html" not in response.text.lower()


async def test_every_schema_route_is_described_and_serves_the_committed_spec(api: Api) -> None:
    committed = COMMITTED
    for path in ("/schema", "/schema/openapi.json", "/schema/openapi.yaml"):
        assert "get" in committed["paths"][path], path
    served_json = (await api.http.get("/schema/openapi.json")).json()
    served_yaml = yaml.safe_load((await api.http.get("/schema/openapi.yaml")).text)
    assert served_json == committed
    assert served_yaml == committed
    assert (await api.http.get("/schema")).json() == committed


@pytest.mark.parametrize("path", ["/v1/memories", "/v1/memories/search", "/mcp"])
async def test_a_body_declared_too_large_is_refused_before_it_is_read(api: Api, path: str) -> None:
    """Issue 18, unrestricted consumption: over real HTTP, a request declaring a body over the
    server's limit is answered 413 at once, from its head alone: the test sends no byte of the
    body, and the answer still comes (a server reading first would wait for it)."""
    alice = await api.new_agent("alice")
    before = await count_memories(api.runtime)
    async with serving(api.runtime) as base_url:
        answered = await _raw_post(
            base_url, path, alice.token, f"Content-Length: {100 * MAX_BODY}", chunks=()
        )
    _assert_too_large(answered)
    assert await count_memories(api.runtime) == before
    assert await _too_large_refusals(api) == 1  # audited like any call


INTERNALS = {
    "tenant_id",
    "owner_id",
    "value_sealed",
    "value_key",
    "content_hash",
    "embedding",
    "lexical",
    "lexical_config",
    "metadata_",
}
"""Columns of a stored memory that no answer carries (issue 18, object-property level)."""


def _keys_and_vectors(answer: Any, keys: set[str], longest: list[int]) -> None:
    """Every key anywhere in `answer`, and the length of its longest list of numbers."""
    if isinstance(answer, dict):
        keys.update(answer)
        for item in answer.values():
            _keys_and_vectors(item, keys, longest)
    elif isinstance(answer, list):
        if answer and all(isinstance(x, float | int) for x in answer):
            longest[0] = max(longest[0], len(answer))
        for item in answer:
            _keys_and_vectors(item, keys, longest)


async def test_no_answer_carries_a_vector_or_an_internal_column(api: Api) -> None:
    alice = await api.new_agent("alice")
    first = await api.remember(alice, key="strict.input", value="the deploy window is tuesday")
    again = await api.http.post(
        "/v1/memories",
        json=VALID | {"key": "strict.input", "value": "the deploy window is wednesday"},
        headers=alice.headers,
    )
    assert again.status_code == 201, again.text
    answers = [again.json()]
    for method, path, body in (
        ("GET", f"/v1/memories/{first['id']}", None),
        ("GET", "/v1/memories", None),
        ("GET", f"/v1/memories/{first['id']}/history", None),
        ("GET", "/v1/memories/counts?group_by=subject", None),
        *(("POST", SEARCH, {"query": "deploy window", "mode": m}) for m in MODES),
    ):
        response = await api.http.request(method, path, json=body, headers=alice.headers)
        assert response.status_code == 200, (path, response.text)
        answers.append(response.json())
    keys: set[str] = set()
    longest = [0]
    _keys_and_vectors(answers, keys, longest)
    assert "value" in keys  # the walk saw memories
    assert keys & INTERNALS == set()
    assert longest[0] < 16  # no vector (256 numbers) in any answer


async def test_a_chunked_mcp_body_past_the_limit_is_a_problem_and_audited(api: Api) -> None:
    """Red team (issue 18): with no Content-Length (chunked), /mcp read up to the limit and
    the MCP SDK answered 413 in plain text, audited without its reason. The body is now
    counted as it comes and refused with the same problem as a declared one."""
    alice = await api.new_agent("alice")
    chunk = b"x" * 65536
    chunks = [f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"] * (MAX_BODY // len(chunk) + 2)
    async with serving(api.runtime) as base_url:
        answered = await _raw_post(
            base_url, "/mcp", alice.token, "Transfer-Encoding: chunked", [*chunks, b"0\r\n\r\n"]
        )
    _assert_too_large(answered)
    assert await _too_large_refusals(api) == 1


async def _raw_post(
    base_url: str, path: str, token: str, framing: str, chunks: Sequence[bytes]
) -> tuple[bytes, str]:
    """POST over a raw connection (the head, then `chunks` as they are): the status line and
    the headers of the answer, within 10 s."""
    port = int(base_url.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
            f"Accept: application/json, text/event-stream\r\n{framing}\r\n\r\n"
        ).encode()
    )
    try:
        async with asyncio.timeout(10):
            for chunk in chunks:
                writer.write(chunk)
                await writer.drain()
            status_line = await reader.readline()
            headers = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
    finally:
        writer.close()
    return status_line, headers


def _assert_too_large(answered: tuple[bytes, str]) -> None:
    status_line, headers = answered
    assert status_line.split()[1] == b"413", status_line
    assert "content-type: application/problem+json" in headers


async def _too_large_refusals(api: Api) -> int:
    found: int = await scalar(
        api.runtime,
        "SELECT count(*) FROM audit_events WHERE tenant_id = :t AND status = 413 AND "
        "reason = 'body-too-large'",
        t=api.tenant_id,
    )
    return found
