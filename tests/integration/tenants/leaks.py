"""What a cross-tenant probe checks besides the answer: the other tenant's stored rows (read as
the database owner, past row-level security), its audit chain, the caller's audit rows, and the
captured logs."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.fixtures.entrance import bypasses_visible

IGNORED_HEADERS = {"date", "x-request-id", "traceparent", "tracestate"}
"""Headers that differ between any two calls (the request id is also replaced in the body)."""

UUID = re.compile(rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
TIMESTAMP = re.compile(rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")
VERSION = re.compile(rb'"policy_version":\d+')


def normalized(
    response: httpx.Response,
    value: str,
    *,
    generated: bool = False,
    volatile: tuple[str, ...] = (),
) -> tuple[int, dict[str, str], bytes]:
    """The answer with the probed value and the request id replaced; with `generated`, also
    the ids, times and policy versions a successful create makes up; the values of the
    `volatile` JSON members too."""
    body = response.content.replace(value.encode(), b"{value}")
    for member in volatile:
        body = re.sub(
            rb'"%s":(\d+|"[0-9a-f]*")' % member.encode(), b'"%s":{v}' % member.encode(), body
        )
    request_id = response.headers.get("x-request-id", "")
    if request_id:
        body = body.replace(request_id.encode(), b"{request}")
    headers = {k: v for k, v in response.headers.items() if k not in IGNORED_HEADERS}
    if generated:
        body = VERSION.sub(b'"policy_version":{n}', TIMESTAMP.sub(b"{t}", UUID.sub(b"{id}", body)))
        headers.pop("content-length", None)
        headers.pop("location", None)
        if "etag" in headers:  # `"<id>.<version>"`: the made-up id, the version kept
            headers["etag"] = UUID.sub(b"{id}", headers["etag"].encode()).decode()
    if generated or volatile:
        headers.pop("content-length", None)
    return response.status_code, headers, body


async def _tenant_tables(conn: Any) -> list[str]:
    """Every table (partitioned parents, not their partitions) with a `tenant_id` column."""
    result = await conn.execute(
        text(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'tenant_id' "
            "WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND NOT c.relispartition "
            "ORDER BY c.relname"
        )
    )
    return [str(name) for name in result.scalars()]


async def tenant_state(oracle: AsyncEngine, tenant_id: str) -> dict[str, Any]:
    """A digest of every row the tenant owns, table by table (its `tenants` row and its audit
    chain included): what a refused call must leave exactly as it was."""
    state: dict[str, Any] = {}
    with bypasses_visible("test oracle: every row of the other tenant, digested"):
        async with oracle.connect() as conn:
            for table in await _tenant_tables(conn):
                row = (
                    await conn.execute(
                        text(
                            f"SELECT count(*), md5(coalesce(string_agg(t::text, '|' "
                            f"ORDER BY t::text), '')) FROM {table} t WHERE tenant_id = :tenant"
                        ),
                        {"tenant": tenant_id},
                    )
                ).one()
                state[table] = tuple(row)
    return state


async def rows_of_requests(oracle: AsyncEngine, request_ids: Iterable[str]) -> list[dict[str, Any]]:
    """The audit rows of these requests, in whatever chain they landed."""
    async with oracle.connect() as conn:
        result = await conn.execute(
            text("SELECT * FROM audit_events WHERE request_id = ANY(:ids) ORDER BY seq"),
            {"ids": list(request_ids)},
        )
        return [dict(row) for row in result.mappings()]


AUDIT_VARYING = {
    "seq",
    "at",
    "request_id",
    "trace_id",
    "latency_us",
    "prev_hash",
    "row_hash",
    "token_id",
}
"""Columns that differ between any two calls of the same caller."""


def audit_shape(
    row: Mapping[str, Any], value: str, *, generated: bool = False, volatile: bool = False
) -> dict[str, Any]:
    """The row without what varies per call, with the probed value replaced (and, with
    `generated`, the ids and policy version a successful create makes up; with `volatile`, the
    count of a growing chain)."""
    shape: dict[str, Any] = {
        k: (str(v).replace(value, "{value}") if v is not None else None)
        for k, v in row.items()
        if k not in AUDIT_VARYING
    }
    if generated:
        shape["target_ids"] = len(row["target_ids"])
        shape["policy_version"] = None
    if volatile:
        shape["result_count"] = None
    return shape


def assert_nothing_of(rendered: str, secrets_: Iterable[str], where: str) -> None:
    for secret in secrets_:
        assert secret not in rendered, f"{secret!r} of the other tenant reached {where}"
