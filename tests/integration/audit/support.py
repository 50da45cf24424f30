"""Helpers of the audit tests: rows as the owner sees them, and the auditor's API calls."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.fixtures.api import Api

PLATFORM = uuid.UUID(int=0)


async def audit_rows(engine: AsyncEngine) -> list[dict[str, Any]]:
    """Every audit row of the database, chain by chain."""
    async with engine.connect() as conn:
        result = await conn.execute(text("SELECT * FROM audit_events ORDER BY tenant_id, seq, at"))
        return [dict(row) for row in result.mappings()]


async def rows_by_request(engine: AsyncEngine) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = {}
    for row in await audit_rows(engine):
        grouped.setdefault(row["request_id"], []).append(row)
    return grouped


async def auditor_get(api: Api, path: str, **params: Any) -> httpx.Response:
    response: httpx.Response = await api.http.get(
        path, params={k: v for k, v in params.items() if v is not None}, headers=api.admin.headers
    )
    return response


async def owner_execute(engine: AsyncEngine, *statements: str, **params: Any) -> None:
    async with engine.begin() as conn:
        for statement in statements:
            await conn.execute(text(statement), params)
