"""Helpers of the audit tests: rows as the owner sees them, and the auditor's API calls."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.fixtures.api import Api

PLATFORM = uuid.UUID(int=0)


async def calls_of_one_agent(api: Api, n: int) -> uuid.UUID:
    """n audited calls by a new agent (lists of varying size); the tenant whose chain grew."""
    alice = await api.new_agent("alice")
    for i in range(n):
        await api.http.get("/v1/memories", headers=alice.headers, params={"limit": i % 5 + 1})
    return uuid.UUID(api.tenant_id)


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


def run_verify_cli(
    tmp_path: Path,
    events: list[dict[str, Any]],
    checkpoint: dict[str, Any] | None = None,
    keys: dict[str, Any] | None = None,
    head: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """`memgate audit verify` on files, as an auditor runs it."""
    export = tmp_path / "export.ndjson"
    export.write_text("".join(json.dumps(event) + "\n" for event in events))
    command = [sys.executable, "-m", "service", "audit", "verify", str(export)]
    if checkpoint is not None and keys is not None:
        (tmp_path / "checkpoint.json").write_text(json.dumps(checkpoint))
        (tmp_path / "keys.json").write_text(json.dumps(keys))
        command += ["--checkpoint", str(tmp_path / "checkpoint.json")]
        command += ["--keys", str(tmp_path / "keys.json")]
    if head is not None:
        command += ["--head", head]
    return subprocess.run(command, capture_output=True, text=True, check=False)  # noqa: S603


async def verify_report(api: Api, **params: Any) -> dict[str, Any]:
    """GET /v1/audit/verify as the tenant's auditor."""
    response = await auditor_get(api, "/v1/audit/verify", **params)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def export_events(api: Api) -> list[dict[str, Any]]:
    """GET /v1/audit/export, parsed."""
    response = await auditor_get(api, "/v1/audit/export")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/x-ndjson")
    return [json.loads(line) for line in response.text.splitlines()]


GUARDS_OFF = "ALTER TABLE audit_events DISABLE TRIGGER audit_no_mutation"
GUARDS_ON = "ALTER TABLE audit_events ENABLE ALWAYS TRIGGER audit_no_mutation"


async def tamper_as_owner(owner: AsyncEngine, *statements: str, **params: Any) -> None:
    """As the owner (a superuser here), with the mutation guards switched off for the edit."""
    await owner_execute(owner, GUARDS_OFF, *statements, GUARDS_ON, **params)
