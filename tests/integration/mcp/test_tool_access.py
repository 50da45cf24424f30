"""The MCP scope matrix, generated from the tool declarations (issue 18, function-level
authorization): every tool, called with a token that holds every other scope but its
operation's, is refused 403 `insufficient-scope` naming that scope, changes nothing and is
audited as a denial of its operation; with a token holding that scope alone it gets past the
scope check. A tool added without a row in `ARGUMENTS` fails the first test by name."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from service.auth.scopes import ADMIN_SCOPES, AGENT_SCOPES
from service.mcp.tools import TOOLS
from service.runtime import Runtime
from tests.fixtures.api import Api
from tests.integration.audit.support import audit_rows
from tests.integration.mcp.support import mcp_session, serving
from tests.integration.memory.support import count_memories

NOTE = {"subject": "service:probe", "kind": "fact", "key": "probe", "value": "probe"}
SOME_ID = str(uuid.UUID(int=7))
ARGUMENTS: dict[str, dict[str, Any]] = {
    "remember": NOTE,
    "remember_many": {"items": [NOTE]},
    "recall": {"query": "probe"},
    "get_memory": {"id": SOME_ID},
    "memory_history": {"id": SOME_ID},
    "revert_memory": {"id": SOME_ID},
    "list_memories": {},
    "count_memories": {"group_by": "kind"},
    "forget": {"id": SOME_ID},
    "list_proposals": {"space_id": SOME_ID},
    "approve": {"id": SOME_ID},
    "reject": {"id": SOME_ID, "reason": "no"},
    "revoke": {"id": SOME_ID, "reason": "probe"},
    "reinstate": {"id": SOME_ID, "reason": "probe"},
    "request_consolidation": {"subject": "service:probe"},
}
"""Valid arguments of each tool (shape only: the ids name nothing)."""
SCOPED = [tool for tool in TOOLS.values() if tool.operation.scope is not None]


def test_every_tool_has_arguments_here() -> None:
    assert set(ARGUMENTS) == set(TOOLS)
    assert list(TOOLS.values()) == SCOPED  # every tool checks a scope of its own


async def _token(api: Api, scopes: set[str]) -> str:
    """A token of a new client holding exactly `scopes` (an admin client when one is an admin
    scope: agents never hold those)."""
    principal = await api.new_principal(f"p-{uuid.uuid4().hex[:8]}")
    kind = "admin" if scopes & ADMIN_SCOPES else "agent"
    created = await api.new_client(principal["id"], sorted(scopes), kind=kind)
    return await api.access_token(created["client"]["client_id"], created["client_secret"])


async def test_a_tool_without_its_scope_is_refused_naming_it_and_changes_nothing(
    api: Api, runtime: Runtime, owner_engine: AsyncEngine
) -> None:
    wrong: dict[str, Any] = {}
    async with serving(runtime) as base_url:
        for tool in SCOPED:
            scope = str(tool.operation.scope)
            pool = ADMIN_SCOPES if scope in ADMIN_SCOPES else AGENT_SCOPES
            token = await _token(api, set(pool) - {scope})
            before = await count_memories(runtime)
            rows_before = len(await audit_rows(owner_engine))
            async with mcp_session(base_url, token) as session:
                result = await session.call_tool(tool.name, ARGUMENTS[tool.name])
            problem = result.structured_content or {}
            added = (await audit_rows(owner_engine))[rows_before:]
            denied = [
                (r["decision"], r["status"], r["reason"])
                for r in added
                if r["action"] == tool.operation.name
            ]
            seen = (
                result.is_error,
                str(problem.get("type", "")).rsplit("/", 1)[-1],
                problem.get("status"),
                scope in str(problem.get("detail", "")),
                await count_memories(runtime) - before,
                denied,
            )
            if seen != (
                True,
                "insufficient-scope",
                403,
                True,
                0,
                [("deny", 403, "insufficient-scope")],
            ):
                wrong[tool.name] = seen
    assert wrong == {}


async def test_a_tool_with_its_scope_alone_gets_past_the_scope_check(
    api: Api, runtime: Runtime
) -> None:
    refused: dict[str, Any] = {}
    async with serving(runtime) as base_url:
        for tool in SCOPED:
            token = await _token(api, {str(tool.operation.scope)})
            async with mcp_session(base_url, token) as session:
                result = await session.call_tool(tool.name, ARGUMENTS[tool.name])
            problem = result.structured_content or {}
            if str(problem.get("type", "")).endswith("/insufficient-scope"):
                refused[tool.name] = problem
    assert refused == {}
