"""Every MCP tool over real HTTP (the official client, a real uvicorn on loopback), tried with
another tenant's ids and names in its arguments, and with the other tenant's token against the
caller's ids: the result is the very text and structured content of a made-up twin, the other
tenant's rows and audit chain are unchanged, the tool calls are audited in the caller's chain
alone, and nothing of the other tenant reaches the logs."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from mcp_types import CallToolResult
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.mcp.tools import TOOLS
from service.runtime import Runtime
from tests.fixtures.canaries import captured_logs
from tests.fixtures.entrance import bypasses_visible
from tests.integration.audit.support import PLATFORM
from tests.integration.mcp.support import mcp_session, serving
from tests.integration.tenants.leaks import assert_nothing_of, tenant_state
from tests.integration.tenants.probes import (
    Value,
    made_up_key,
    made_up_subject,
    memory_id_of,
    name_of,
    space_id_of,
)
from tests.integration.tenants.world import Side, World, seed_side

NOTE = {"subject": "service:probe", "kind": "fact", "key": "probe", "value": "probe"}


@dataclass(frozen=True)
class ToolProbe:
    tool: str
    slot: str
    arguments: Callable[[str], dict[str, Any]]
    value: Value
    expect: str | None
    """The problem slug the made-up twin gets, or None for a result."""
    twin: Callable[[Side, str], str] = lambda side, value: str(uuid.uuid4())
    by_id: bool = False
    """Also run the other way round (the other tenant's token, and its delegated token, against
    the caller's id)."""

    @property
    def id(self) -> str:
        return f"{self.tool} [{self.slot}]"


TOOL_PROBES = (
    ToolProbe("approve", "id", lambda v: {"id": v}, memory_id_of, "memory-not-found", by_id=True),
    ToolProbe(
        "reject",
        "id",
        lambda v: {"id": v, "reason": "no"},
        memory_id_of,
        "memory-not-found",
        by_id=True,
    ),
    ToolProbe(
        "list_proposals",
        "space_id",
        lambda v: {"space_id": v},
        space_id_of,
        "space-not-found",
    ),
    ToolProbe(
        "get_memory", "id", lambda v: {"id": v}, memory_id_of, "memory-not-found", by_id=True
    ),
    ToolProbe("forget", "id", lambda v: {"id": v}, memory_id_of, "memory-not-found", by_id=True),
    ToolProbe(
        "memory_history", "id", lambda v: {"id": v}, memory_id_of, "memory-not-found", by_id=True
    ),
    ToolProbe(
        "revert_memory", "id", lambda v: {"id": v}, memory_id_of, "memory-not-found", by_id=True
    ),
    ToolProbe(
        "revoke",
        "id",
        lambda v: {"id": v, "reason": "probe"},
        memory_id_of,
        "memory-not-found",
        by_id=True,
    ),
    ToolProbe(
        "reinstate",
        "id",
        lambda v: {"id": v, "reason": "probe"},
        memory_id_of,
        "memory-not-found",
        by_id=True,
    ),
    ToolProbe(
        "remember", "space_id", lambda v: {**NOTE, "space_id": v}, space_id_of, "space-not-found"
    ),
    ToolProbe(
        "remember",
        "derived_from",
        lambda v: {**NOTE, "derived_from": [v]},
        memory_id_of,
        "memory-not-found",
    ),
    ToolProbe(
        "remember_many",
        "items[].space_id",
        lambda v: {"items": [{**NOTE, "space_id": v}]},
        space_id_of,
        "batch-rejected",
    ),
    ToolProbe(
        "list_memories", "space_id", lambda v: {"space_id": v}, space_id_of, "space-not-found"
    ),
    ToolProbe(
        "list_memories",
        "subject",
        lambda v: {"subject": v},
        name_of("subject"),
        None,
        twin=made_up_subject,
    ),
    ToolProbe("list_memories", "key", lambda v: {"key": v}, name_of("key"), None, twin=made_up_key),
    ToolProbe(
        "count_memories", "space_id", lambda v: {"space_id": v}, space_id_of, "space-not-found"
    ),
    ToolProbe(
        "count_memories",
        "subject",
        lambda v: {"subject": v, "group_by": "kind"},
        name_of("subject"),
        None,
        twin=made_up_subject,
    ),
    ToolProbe(
        "recall",
        "space_id filter",
        lambda v: {"query": "probe", "filters": {"space_id": v}},
        space_id_of,
        "space-not-found",
    ),
    ToolProbe(
        "recall",
        "subject filter",
        lambda v: {"query": "probe", "filters": {"subject": v}},
        name_of("subject"),
        None,
        twin=made_up_subject,
    ),
    # An agent never holds run:jobs: refused before the space is looked at, the same for all.
    ToolProbe(
        "request_consolidation",
        "space_id",
        lambda v: {"subject": "service:probe", "space_id": v},
        space_id_of,
        "insufficient-scope",
    ),
)
CASES = [(probe, "ids") for probe in TOOL_PROBES] + [
    (probe, direction)
    for probe in TOOL_PROBES
    if probe.by_id
    for direction in ("token", "delegated")
]
DIRECTIONS: dict[str, Callable[[World], World]] = {
    "ids": lambda world: world,
    "token": World.swapped,
    "delegated": World.delegated,
}


@pytest.fixture(scope="module")
async def base_url(module_runtime: Runtime) -> AsyncIterator[str]:
    async with serving(module_runtime) as base:
        yield base


def _seen(result: CallToolResult, value: str) -> tuple[bool, str, str]:
    """What a model reads (the text) and the structured copy, with the probed value replaced."""
    [content] = result.content
    assert content.type == "text"
    structured = json.dumps(result.structured_content, sort_keys=True)
    return (
        result.is_error,
        content.text.replace(value, "{value}"),
        structured.replace(value, "{value}"),
    )


async def _chain_head(oracle: AsyncEngine, tenant_id: str) -> int:
    async with oracle.connect() as conn:
        seq = await conn.scalar(
            text("SELECT coalesce(max(seq), 0) FROM audit_events WHERE tenant_id = :t"),
            {"t": tenant_id},
        )
    return int(seq)


async def _tool_rows(oracle: AsyncEngine, after_seq: dict[str, int]) -> list[dict[str, Any]]:
    """Every audit row appended after these heads, in any chain."""
    async with oracle.connect() as conn:
        result = await conn.execute(text("SELECT * FROM audit_events ORDER BY tenant_id, seq"))
        rows = [dict(row) for row in result.mappings()]
    return [row for row in rows if row["seq"] > after_seq.get(str(row["tenant_id"]), 0)]


@pytest.mark.parametrize(("probe", "direction"), CASES, ids=[f"{d}: {p.id}" for p, d in CASES])
async def test_a_tool_answers_another_tenants_thing_like_nothing(
    world: World, oracle: AsyncEngine, base_url: str, probe: ToolProbe, direction: str
) -> None:
    probed = DIRECTIONS[direction](world)
    home, away = probed.home, probed.away
    value = probe.value(away)
    twin = probe.twin(home, value)
    assert len(twin) == len(value)
    # As in the REST matrix: write the background recall buffer before each look.
    recalls = home.api.runtime.recalls
    await recalls.flush()
    before = await tenant_state(oracle, away.tenant_id)
    chains = (home.tenant_id, away.tenant_id, str(PLATFORM))
    heads = {t: await _chain_head(oracle, t) for t in chains}
    with captured_logs() as events:
        async with mcp_session(base_url, home.agent.token) as session:
            foreign = await session.call_tool(probe.tool, probe.arguments(value))
            made_up = await session.call_tool(probe.tool, probe.arguments(twin))
    await recalls.flush()
    assert await tenant_state(oracle, away.tenant_id) == before

    if probe.expect is None:
        assert not made_up.is_error, made_up
    else:
        assert made_up.is_error
        assert made_up.structured_content is not None
        assert made_up.structured_content["type"].endswith("/" + probe.expect)
    assert _seen(foreign, value) == _seen(made_up, twin)

    rows = [row for row in await _tool_rows(oracle, heads) if row["route"] == "/mcp"]
    tool_rows = [row for row in rows if row["action"] == TOOLS[probe.tool].operation.name]
    assert len(tool_rows) == 2, rows
    assert {str(row["tenant_id"]) for row in rows} == {home.tenant_id}
    leaks = [thing for thing in (*away.canaries, *away.ids) if thing != value]
    assert_nothing_of(repr(rows), leaks, "the caller's audit rows")
    assert_nothing_of(repr(events), leaks, "the logs")
    [content] = foreign.content
    assert content.type == "text"
    assert_nothing_of(content.text, leaks, "the tool result")


def test_every_tool_has_cross_tenant_probes() -> None:
    """A tool added later without a probe here fails."""
    assert {probe.tool for probe in TOOL_PROBES} == set(TOOLS)


@pytest.fixture(scope="module")
async def neighbour(world: World) -> Side:
    """Another team of the caller's own tenant, seeded alike: its space and memory are not the
    caller's to see (issue 18: BOLA inside a tenant, for every tool)."""
    return await seed_side(world.home.api, "near03")


async def _memories_state(oracle: AsyncEngine, tenant_id: str) -> tuple[int, str]:
    with bypasses_visible("test oracle: every memory of the tenant, digested"):
        async with oracle.connect() as conn:
            row = (
                await conn.execute(
                    text(
                        "SELECT count(*), md5(coalesce(string_agg(m::text, '|' ORDER BY "
                        "m::text), '')) FROM memories m WHERE tenant_id = :tenant"
                    ),
                    {"tenant": tenant_id},
                )
            ).one()
    return int(row[0]), str(row[1])


@pytest.mark.parametrize("probe", TOOL_PROBES, ids=[probe.id for probe in TOOL_PROBES])
async def test_a_tool_answers_another_teams_thing_in_the_tenant_like_nothing(
    world: World, neighbour: Side, oracle: AsyncEngine, base_url: str, probe: ToolProbe
) -> None:
    home = world.home
    value = probe.value(neighbour)
    twin = probe.twin(home, value)
    before = await _memories_state(oracle, home.tenant_id)
    async with mcp_session(base_url, home.agent.token) as session:
        theirs = await session.call_tool(probe.tool, probe.arguments(value))
        made_up = await session.call_tool(probe.tool, probe.arguments(twin))
    assert await _memories_state(oracle, home.tenant_id) == before
    assert _seen(theirs, value) == _seen(made_up, twin)
    [content] = theirs.content
    assert content.type == "text"
    leaks = [f"canary-{neighbour.tag}-content", neighbour.memory["id"], neighbour.space["id"]]
    assert_nothing_of(content.text, [thing for thing in leaks if thing != value], "the result")
