"""The cross-tenant matrix: every route of the app, tried with another tenant's ids (in the
path, in query filters, in bodies), names that exist only in the other tenant, and the other
tenant's valid tokens against the caller's ids. Each probe answers the very bytes of its made-up
twin (an id or name that exists nowhere), changes no row of the other tenant, adds no row to its
audit chain, writes the caller's audit row into the caller's chain alone (and the same row as
the twin's), and logs nothing of the other tenant.

Both tenants are made through the public API (`Api.bootstrap`, `api.other_tenant()`) and are
shared by the whole module (tests/integration/tenants/conftest.py): every probe checks that it
changed nothing of the other tenant, so sharing them is sound.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from service.problems import PROBLEM_TYPES
from tests.fixtures.api import Agent
from tests.fixtures.canaries import captured_logs
from tests.integration.audit.support import PLATFORM
from tests.integration.memory.support import problem_uri
from tests.integration.tenants.leaks import (
    assert_nothing_of,
    audit_shape,
    normalized,
    rows_of_requests,
    tenant_state,
)
from tests.integration.tenants.probes import (
    CREATING,
    DELEGATED_PROBES,
    ID,
    LISTING,
    NAMES_NOTHING,
    PROBES,
    TOKEN_PROBES,
    Ask,
    Probe,
)
from tests.integration.tenants.world import Side, World

CASES = (
    [(probe, "ids") for probe in PROBES]
    + [(probe, "token") for probe in TOKEN_PROBES]
    + [(probe, "delegated") for probe in DELEGATED_PROBES]
)
"""Every probe as written (the caller names the other tenant's things), every path-id probe the
other way round (the other tenant's token names the caller's things), and the memory ones with
the other tenant's delegated token too."""
DIRECTIONS: dict[str, Callable[[World], World]] = {
    "ids": lambda world: world,
    "token": World.swapped,
    "delegated": World.delegated,
}


async def send(http: Any, ask: Ask, caller: Agent | None) -> httpx.Response:
    headers = caller.headers if caller is not None and ask.basic is None else {}
    response: httpx.Response = await http.request(
        ask.method,
        ask.path,
        params=ask.params,
        json=ask.json,
        data=ask.form,
        headers=headers,
        auth=ask.basic,
    )
    return response


def _other_things(away: Side, named: str) -> list[str]:
    """What of the other tenant must reach nothing: its canaries and ids, apart from the one
    value the caller itself sent (which the caller's own audit row and answer may echo)."""
    return [thing for thing in (*away.canaries, *away.ids) if thing not in named]


def _expected(response: httpx.Response, expect: int | str) -> None:
    """The made-up twin answers what the probe says, so the probe reached the lookup."""
    if isinstance(expect, int):
        assert response.status_code == expect, response.text
        return
    assert response.status_code == PROBLEM_TYPES[expect].status, response.text
    assert response.json()["type"] == problem_uri(expect), response.text


async def probe_once(world: World, oracle: AsyncEngine, probe: Probe) -> None:
    home, away = world.home, world.away
    caller = probe.caller(home)
    value = probe.value(away)
    twin = probe.twin(home, value)
    assert len(twin) == len(value) or probe.route == "POST /oauth/token"
    # Recalls are written in the background (docs/jobs.md, memory.age_unused): write what the
    # worlds' setup left waiting before the first look, and what the probe noted before the
    # second, so a probe that made the other tenant's rows look used is seen, and nothing else.
    recalls = home.api.runtime.recalls
    await recalls.flush()
    before = await tenant_state(oracle, away.tenant_id)
    with captured_logs() as events:
        foreign = await send(home.api.http, probe.ask(home, value), caller)
        made_up = await send(home.api.http, probe.ask(home, twin), caller)
    await recalls.flush()
    after = await tenant_state(oracle, away.tenant_id)

    _expected(made_up, probe.expect)
    generated, volatile = probe.creates, probe.volatile
    assert normalized(foreign, value, generated=generated, volatile=volatile) == normalized(
        made_up, twin, generated=generated, volatile=volatile
    ), (
        foreign.text,
        made_up.text,
    )
    assert after == before, "the probe changed the other tenant's rows or its audit chain"

    request_ids = {
        foreign.headers["x-request-id"]: value,
        made_up.headers["x-request-id"]: twin,
    }
    rows = await rows_of_requests(oracle, request_ids)
    assert sorted(row["request_id"] for row in rows) == sorted(request_ids), rows
    chain = str(PLATFORM) if probe.platform_audit else home.tenant_id
    assert {str(row["tenant_id"]) for row in rows} == {chain}
    shapes = [
        audit_shape(
            row,
            request_ids[row["request_id"]],
            generated=probe.creates,
            volatile=bool(probe.volatile),
        )
        for row in rows
    ]
    assert shapes[0] == shapes[1]
    leaks = _other_things(away, value)
    assert_nothing_of(repr(rows), leaks, "the caller's audit rows")
    assert_nothing_of(repr(events), leaks, "the logs")
    assert_nothing_of(foreign.text, leaks, "the answer")


async def _listing(world: World, oracle: AsyncEngine, probe: Probe) -> None:
    """A route that names nothing: the answer carries nothing of the other tenant."""
    home, away = world.home, world.away
    before = await tenant_state(oracle, away.tenant_id)
    with captured_logs() as events:
        response = await send(home.api.http, probe.ask(home, ""), probe.caller(home))
    _expected(response, probe.expect)
    assert await tenant_state(oracle, away.tenant_id) == before
    rows = await rows_of_requests(oracle, [response.headers["x-request-id"]])
    assert [str(row["tenant_id"]) for row in rows] == [home.tenant_id]
    leaks = _other_things(away, "")
    if probe.route.startswith("GET /v1/audit/"):
        # The caller's own chain records the ids its probes named (target ids, as sent: the
        # platform-route probes name the other tenant's id itself); what must not be there is
        # the other tenant's content or names, nor a row of the other chain (checked above).
        leaks = [canary for canary in away.canaries if canary != away.tenant_id]
    assert_nothing_of(response.text, leaks, "the answer")
    assert_nothing_of(repr(rows), leaks, "the caller's audit row")
    assert_nothing_of(repr(events), leaks, "the logs")


@pytest.mark.parametrize(
    ("probe", "direction"),
    CASES,
    ids=[f"{direction}: {probe.id}" for probe, direction in CASES],
)
async def test_another_tenants_thing_answers_like_nothing(
    world: World, oracle: AsyncEngine, probe: Probe, direction: str
) -> None:
    probed = DIRECTIONS[direction](world)
    if probe.kind == LISTING:
        await _listing(probed, oracle, probe)
    else:
        await probe_once(probed, oracle, probe)


def _route_key(method: str | None, path: str) -> str:
    template = re.sub(r"\{\w+:\w+\}", "{id}", path).rstrip("/") or "/"
    return f"{method} {template}" if method else template


def test_every_route_has_cross_tenant_probes() -> None:
    """A route added to the app without a probe here (or a reason it names nothing) fails."""
    from service.app import create_app

    declared = set()
    for route in create_app().routes:
        methods = [m for m in getattr(route, "methods", ()) if m not in {"HEAD", "OPTIONS"}]
        declared |= {_route_key(m, route.path) for m in methods} or {route.path}
    probed = {probe.route for probe in (*PROBES, *CREATING)}
    assert probed.isdisjoint(NAMES_NOTHING)
    assert declared == probed | set(NAMES_NOTHING)


def test_every_id_taking_route_is_probed_both_ways() -> None:
    """Each route with an id in its path has a path-id probe, run with the caller's token and
    with the other tenant's token."""
    id_routes = {probe.route for probe in PROBES if "{id}" in probe.route}
    assert id_routes == {probe.route for probe in TOKEN_PROBES}
    assert all(probe.kind == ID for probe in TOKEN_PROBES)


@pytest.mark.parametrize(
    "route", ["GET /v1/memories/{id}", "GET /v1/clients/{id}", "GET /v1/memories"]
)
async def test_the_probe_tells_a_visible_thing_apart(
    world: World, oracle: AsyncEngine, route: str
) -> None:
    """The harness itself: pointed at the caller's own things (a world whose "other" tenant is
    the caller's), the same probe fails, so a passing probe means the answers really matched."""
    probe = next(p for p in PROBES if p.route == route)
    with pytest.raises(AssertionError):
        await probe_once(World(world.home, world.home), oracle, probe)
