"""Bad input answers a specific problem, writes nothing, and a 500 leaks nothing."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.settings import MemorySettings, ServerSettings
from tests.fixtures.api import Api
from tests.fixtures.entrance import bypasses_visible
from tests.integration.memory.support import assert_problem, count_memories, memory_rows

MAX_VALUE = MemorySettings().max_value_chars
MAX_BODY = ServerSettings().max_body_bytes
VALID = {"subject": "service:billing", "kind": "fact", "key": "bad.input", "value": "v"}
SEARCH = "/v1/memories/search"


def _b64(payload: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(payload).encode()).decode()


@dataclass(frozen=True)
class Case:
    name: str
    method: str
    path: str
    status: int
    slug: str
    json: Any = None
    content: bytes | None = None
    field: str | None = None  # named in `errors` of an invalid-request problem
    mentions: str | None = None  # appears in `detail`

    def __str__(self) -> str:
        return self.name


CASES: tuple[Case, ...] = (
    Case(
        "unknown-field",
        "POST",
        "/v1/memories",
        422,
        "invalid-request",
        json=VALID | {"importance": 5},
        mentions="importance",
    ),
    Case(
        "unknown-search-field",
        "POST",
        SEARCH,
        422,
        "invalid-request",
        json={"query": "q", "top_k": 3},
        mentions="top_k",
    ),
    Case(
        "k-as-string",
        "POST",
        SEARCH,
        422,
        "invalid-request",
        json={"query": "q", "k": "3"},
        field="k",
    ),
    Case(
        "min-score-as-string",
        "POST",
        SEARCH,
        422,
        "invalid-request",
        json={"query": "q", "min_score": "0.5"},
        field="min_score",
    ),
    Case(
        "value-as-number",
        "POST",
        "/v1/memories",
        422,
        "invalid-request",
        json=VALID | {"value": 42},
        field="value",
    ),
    Case(
        "ttl-as-string",
        "POST",
        "/v1/memories",
        422,
        "invalid-request",
        json=VALID | {"ttl_seconds": "60"},
        field="ttl_seconds",
    ),
    Case(
        "valid-from-as-number",
        "POST",
        "/v1/memories",
        422,
        "invalid-request",
        json=VALID | {"valid_from": 1_700_000_000},
        field="valid_from",
    ),
    Case(
        "missing-value",
        "POST",
        "/v1/memories",
        422,
        "invalid-request",
        json={k: v for k, v in VALID.items() if k != "value"},
        mentions="value",
    ),
    Case(
        "missing-query",
        "POST",
        SEARCH,
        422,
        "invalid-request",
        json={"k": 3},
        mentions="query",
    ),
    Case(
        "invalid-kind",
        "POST",
        "/v1/memories",
        422,
        "invalid-request",
        json=VALID | {"kind": "rumour"},
        field="kind",
    ),
    Case(
        "invalid-filter-kind",
        "POST",
        SEARCH,
        422,
        "invalid-request",
        json={"query": "q", "filters": {"kind": "rumour"}},
        mentions="kind",
    ),
    Case(
        "empty-value",
        "POST",
        "/v1/memories",
        422,
        "invalid-request",
        json=VALID | {"value": ""},
        field="value",
    ),
    Case(
        "key-with-spaces",
        "POST",
        "/v1/memories",
        422,
        "invalid-request",
        json=VALID | {"key": "deploy window"},
        field="key",
    ),
    Case(
        "value-too-long",
        "POST",
        "/v1/memories",
        422,
        "value-too-long",
        json=VALID | {"value": "x" * (MAX_VALUE + 1)},
        mentions=str(MAX_VALUE),
    ),
    Case(
        "ttl-zero",
        "POST",
        "/v1/memories",
        422,
        "invalid-request",
        json=VALID | {"ttl_seconds": 0},
        field="ttl_seconds",
    ),
    Case(
        "valid-from-naive",
        "POST",
        "/v1/memories",
        422,
        "invalid-request",
        json=VALID | {"valid_from": "2026-11-30T12:00:00"},
        field="valid_from",
    ),
    Case("k-zero", "POST", SEARCH, 422, "k-out-of-range", json={"query": "q", "k": 0}),
    Case("k-101", "POST", SEARCH, 422, "k-out-of-range", json={"query": "q", "k": 101}),
    Case(
        "min-score-2",
        "POST",
        SEARCH,
        422,
        "invalid-request",
        json={"query": "q", "min_score": 2},
        field="min_score",
    ),
    Case("get-malformed-id", "GET", "/v1/memories/not-a-uuid", 400, "malformed-id"),
    Case("delete-malformed-id", "DELETE", "/v1/memories/not-a-uuid", 400, "malformed-id"),
    Case("cursor-garbage", "GET", "/v1/memories?cursor=%%%not-base64!!", 400, "bad-cursor"),
    Case("cursor-other-json", "GET", f"/v1/memories?cursor={_b64({'page': 2})}", 400, "bad-cursor"),
    Case(
        "cursor-bad-uuid",
        "GET",
        f"/v1/memories?cursor={_b64({'v': 1, 'after': 'nope'})}",
        400,
        "bad-cursor",
    ),
    Case("limit-0", "GET", "/v1/memories?limit=0", 422, "invalid-request", field="limit"),
    Case("limit-1000", "GET", "/v1/memories?limit=1000", 422, "invalid-request", field="limit"),
    Case("limit-text", "GET", "/v1/memories?limit=ten", 422, "invalid-request", field="limit"),
    Case("list-bad-kind", "GET", "/v1/memories?kind=rumour", 422, "invalid-request", field="kind"),
    Case(
        "body-not-json",
        "POST",
        "/v1/memories",
        400,
        "malformed-request",
        content=b'{"subject": "service:billing", kind: fact',
    ),
    Case(
        "body-empty",
        "POST",
        "/v1/memories",
        422,
        "invalid-request",
        content=b"",
        field="body",
    ),
    Case(
        "body-json-array",
        "POST",
        "/v1/memories",
        422,
        "invalid-request",
        content=b'["service:billing", "fact", "k", "v"]',
    ),
    Case(
        "body-over-server-max",
        "POST",
        "/v1/memories",
        413,
        "body-too-large",
        content=json.dumps(VALID | {"value": "x" * MAX_BODY}).encode(),
    ),
    Case(
        "value-nul",
        "POST",
        "/v1/memories",
        422,
        "invalid-request",
        json=VALID | {"value": "a\u0000b"},
        field="value",
    ),
    Case(
        "source-nul",
        "POST",
        "/v1/memories",
        422,
        "invalid-request",
        json=VALID | {"source": "a\u0000b"},
        field="source",
    ),
    Case(
        "metadata-value-nul",
        "POST",
        "/v1/memories",
        422,
        "invalid-request",
        json=VALID | {"metadata": {"a": "x\u0000y"}},
        field="metadata",
    ),
    Case(
        "metadata-key-nul",
        "POST",
        "/v1/memories",
        422,
        "invalid-request",
        json=VALID | {"metadata": {"a\u0000": 1}},
        field="metadata",
    ),
    Case(
        "metadata-too-deep",
        "POST",
        "/v1/memories",
        422,
        "invalid-request",
        json=VALID | {"metadata": {"x": [[[[[[[[[[[[[[[[[[["deep"]]]]]]]]]]]]]]]]]]]}},
        field="metadata",
    ),
    Case(
        "body-nested-1000",
        "POST",
        "/v1/memories",
        400,
        "malformed-request",
        content=(
            b'{"subject":"s","kind":"fact","key":"bad.input","value":"v","metadata":{"x":'
            + b"[" * 1000
            + b"]" * 1000
            + b"}}"
        ),
    ),
    Case(
        "valid-from-before-year-1-in-utc",
        "POST",
        "/v1/memories",
        422,
        "invalid-request",
        json=VALID | {"valid_from": "0001-01-01T00:00:00+01:00"},
        field="valid_from",
    ),
    Case(
        "valid-from-after-year-9999-in-utc",
        "POST",
        "/v1/memories",
        422,
        "invalid-request",
        json=VALID | {"valid_from": "9999-12-31T23:59:59-01:00"},
        field="valid_from",
    ),
    Case(
        "list-filter-subject-nul",
        "GET",
        "/v1/memories?subject=%00",
        422,
        "invalid-request",
        field="subject",
    ),
    Case(
        "cursor-deeply-nested",
        "GET",
        "/v1/memories?cursor=" + base64.urlsafe_b64encode(b"[" * 5000).decode(),
        400,
        "bad-cursor",
    ),
    Case(
        "cursor-too-long",
        "GET",
        "/v1/memories?cursor=" + _b64({"v": 1, "after": "x" * 300}),
        400,
        "bad-cursor",
    ),
    Case(
        "key-trailing-newline",
        "POST",
        "/v1/memories",
        422,
        "invalid-request",
        json=VALID | {"key": "bad.input\n"},
        field="key",
    ),
    Case(
        "subject-trailing-newline",
        "POST",
        "/v1/memories",
        422,
        "invalid-request",
        json=VALID | {"subject": "service:billing\n"},
        field="subject",
    ),
    Case(
        "list-filter-key-trailing-newline",
        "GET",
        "/v1/memories?key=bad.input%0A",
        422,
        "invalid-request",
        field="key",
    ),
    Case(
        "list-filter-key-nul", "GET", "/v1/memories?key=a%00b", 422, "invalid-request", field="key"
    ),
)


SERVER_OWNED = {
    "id": "01a24305-b779-75db-be59-a4b85eaecf1a",
    "tenant_id": "01a24305-b779-75db-be59-a4b85eaecf1b",
    "version": 7,
    "etag": '"x.7"',
    "status": "live",
    "provenance": {"writer_id": "01a24305-b779-75db-be59-a4b85eaecf1c"},
    "writer_id": "01a24305-b779-75db-be59-a4b85eaecf1c",
    "recorded_at": "2026-01-01T00:00:00Z",
    "superseded_by": "01a24305-b779-75db-be59-a4b85eaecf1d",
    "embedding": [0.1] * 256,
    "embedding_model": "forged/model",
    "read_requires": ["01a24305-b779-75db-be59-a4b85eaecf1e"],
}
"""Fields the server owns (issue 18, object-property level): a request naming one is refused
and nothing is stored, never silently taken or silently dropped."""

CASES += tuple(
    Case(
        f"server-owned-{name}",
        "POST",
        "/v1/memories",
        422,
        "invalid-request",
        json=VALID | {name: value},
        mentions=name,
    )
    for name, value in SERVER_OWNED.items()
)
CASES += (
    Case(
        "query-over-4096-characters",
        "POST",
        SEARCH,
        422,
        "invalid-request",
        json={"query": "q" * 4097},
        field="query",
    ),
)


@pytest.mark.parametrize("case", CASES, ids=str)
async def test_bad_input_is_a_specific_problem_and_writes_nothing(api: Api, case: Case) -> None:
    alice = await api.new_agent("alice")
    existing = await api.remember(alice, key="existing", value="already here")
    before = await count_memories(api.runtime)
    headers = dict(alice.headers)
    if case.content is not None:
        headers["Content-Type"] = "application/json"
    response = await api.http.request(
        case.method, case.path, json=case.json, content=case.content, headers=headers
    )
    problem = assert_problem(response, case.status, case.slug)
    if case.field is not None:
        assert case.field in {error["field"] for error in problem.get("errors", [])}, problem
        assert case.field in problem["detail"]
    if case.mentions is not None:
        assert case.mentions in problem["detail"], problem
    assert "Traceback" not in response.text
    assert await count_memories(api.runtime) == before
    assert await memory_rows(api.runtime, "key = 'bad.input'") == []
    still = await api.http.get(f"/v1/memories/{existing['id']}", headers=alice.headers)
    assert still.status_code == 200
    assert still.json()["status"] == "live"


@pytest.mark.parametrize("name", sorted(SERVER_OWNED))
async def test_a_server_owned_field_in_a_batch_item_is_refused_and_writes_nothing(
    api: Api, name: str
) -> None:
    alice = await api.new_agent("alice")
    before = await count_memories(api.runtime)
    response = await api.http.post(
        "/v1/memories:batch",
        json={"items": [VALID | {"key": "bad.input.ok"}, VALID | {name: SERVER_OWNED[name]}]},
        headers=alice.headers,
    )
    problem = assert_problem(response, 422, "batch-rejected")
    (error,) = problem["errors"]
    assert error["index"] == 1
    assert error["type"].endswith("/invalid-request")
    assert name in error["detail"]
    assert await count_memories(api.runtime) == before


async def test_limits_are_inclusive(api: Api) -> None:
    alice = await api.new_agent("alice")
    longest = await api.remember(alice, key="bad.input", value="x" * MAX_VALUE)
    assert len(longest["value"]) == MAX_VALUE
    for k in (1, 100):
        response = await api.search(alice, "x", k=k)
        assert response.status_code == 200, response.text
        assert response.json()["k"] == k
    for limit in (1, 100):
        response = await api.http.get(
            "/v1/memories", params={"limit": limit}, headers=alice.headers
        )
        assert response.status_code == 200, response.text
    response = await api.search(alice, "x", min_score=1)
    assert response.status_code == 200, response.text
    assert response.json()["min_score"] == 1.0


async def test_internal_error_leaks_no_sql_or_traceback(
    api: Api, owner_engine: AsyncEngine
) -> None:
    alice = await api.new_agent("alice")
    await api.remember(alice, key="before.break", value="written before the schema broke")
    async with owner_engine.begin() as conn:
        await conn.execute(text("ALTER TABLE memories RENAME COLUMN value TO value_x"))
    calls = [
        ("POST", "/v1/memories", VALID),
        ("GET", "/v1/memories", None),
        ("POST", SEARCH, {"query": "schema"}),
    ]
    for method, path, body in calls:
        response = await api.http.request(method, path, json=body, headers=alice.headers)
        problem = assert_problem(response, 500, "internal-error")
        assert set(problem) == {"type", "title", "status", "detail", "instance"}
        assert problem["instance"] == path
        lowered = response.text.lower()
        for leak in (
            "traceback",
            "select",
            "insert",
            "psycopg",
            "sqlalchemy",
            "undefinedcolumn",
            "value_x",
            "column",
            "embedding",
            "tenant_id",
            "superseded",
            "already",
            "service:billing",
        ):
            assert leak not in lowered, (leak, response.text)
    with bypasses_visible("test oracle: what is really stored"):
        async with owner_engine.connect() as conn:
            rows = (await conn.execute(text("SELECT count(*) FROM memories"))).scalar()
    assert rows == 1
