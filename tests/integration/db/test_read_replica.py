"""Read-only calls on a real streaming hot standby, and the staleness bound.

One primary and one standby of it (`pg_basebackup -R`) for the module; the tests run in order
(the last stops the standby). Three runtimes stand for three processes: `reader` (the bound
250 ms), `writer` (no replica: another process's writes are what the bound is about) and
`lenient` (a bound of a minute, to show what the standby itself holds while its replay is
paused)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import psycopg
import pytest
from litestar.testing import AsyncTestClient
from sqlalchemy.engine import make_url

from service.app import create_app
from service.db.migrate import upgrade
from service.embeddings import Embedder
from service.runtime import Runtime, build_runtime
from service.settings import ExternalIssuer
from tests.conftest import PUBLIC_URL, make_settings
from tests.fixtures import entrance
from tests.fixtures.api import Agent, Api, TestClient
from tests.fixtures.postgres import app_login
from tests.fixtures.replication import Pair, primary_and_standby
from tests.integration.auth.external_idp import IDP, SUBJECT, FakeIdp, idp_claims
from tests.integration.auth.forge import sign

BOUND_MS = 250
QUERY = {"query": "eu-west-1 for billing"}
WAIT_SECONDS = 10.0
"""How long a loop waits for the standby to catch up at most (it takes milliseconds)."""


@dataclass
class Node:
    runtime: Runtime
    http: TestClient


@dataclass
class World:
    pair: Pair
    owner_url: str
    standby_owner_url: str
    reader: Node
    writer: Node
    lenient: Node
    api: Api
    """acme's admin, on the writer."""


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    with primary_and_standby() as made:
        with psycopg.connect(made.url(made.primary_port), autocommit=True) as conn:
            conn.execute("CREATE DATABASE memgate")
        owner = made.url(made.primary_port, "memgate")
        with entrance.bypasses_visible("migrations define the memory table"):
            upgrade(owner)
        app_login(owner)
        yield made


def _on_port(url: str, port: int) -> str:
    return make_url(url).set(port=port).render_as_string(hide_password=False)


@pytest.fixture(scope="module")
async def world(
    pair: Pair, embedder: Embedder, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[World]:
    owner = pair.url(pair.primary_port, "memgate")
    standby_app = _on_port(app_login(owner), pair.standby_port)
    nodes: list[tuple[Node, Any]] = []

    async def node(name: str, lag_ms: int | None) -> Node:
        settings = make_settings(owner, tmp_path_factory.mktemp(name))
        if lag_ms is not None:
            database = replace(
                settings.database, read_url=standby_app, read_replica_max_lag_ms=lag_ms
            )
            settings = replace(settings, database=database)
        runtime = await build_runtime(settings, app_login(owner), embedder, owner_url=owner)
        client = AsyncTestClient(app=create_app(runtime), base_url=PUBLIC_URL)
        made = Node(runtime, await client.__aenter__())
        nodes.append((made, client))
        return made

    writer = await node("writer", None)
    reader = await node("reader", BOUND_MS)
    lenient = await node("lenient", 60_000)
    api = await Api.bootstrap(writer.http, writer.runtime)
    try:
        yield World(
            pair,
            owner,
            pair.url(pair.standby_port, "memgate"),
            reader,
            writer,
            lenient,
            api,
        )
    finally:
        for made, client in reversed(nodes):
            await client.__aexit__(None, None, None)
            await made.runtime.close()


def _replica(node: Node) -> Any:
    replica = node.runtime.replica
    assert replica is not None
    return replica


async def _on_replica(node: Node, agent: Agent, method: str, path: str, **kw: Any) -> Any:
    """The call, repeated until the standby answers it (it replays the setup's writes within
    milliseconds); its answer."""
    replica = _replica(node)
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        served = replica.served
        response = await node.http.request(method, path, headers=agent.headers, **kw)
        assert response.status_code == 200, response.text
        if replica.served == served + 1:
            return response.json()
        assert time.monotonic() < deadline, f"never served by the standby: {replica.fallbacks}"
        await asyncio.sleep(0.05)


def _search_ids(body: dict[str, Any]) -> list[str]:
    return [hit["memory"]["id"] for hit in body["hits"]]


def _audited(url: str, action: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM audit_events WHERE action = %s AND status = 200", (action,)
        ).fetchone()
    assert row is not None
    count: int = row[0]
    return count


def _standby_sessions(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE usename = 'memgate_api'"
        ).fetchone()
    assert row is not None
    count: int = row[0]
    return count


@dataclass
class Fixtures:
    agent: Agent
    memory_id: str


@pytest.fixture(scope="module")
async def facts(world: World) -> Fixtures:
    agent = await world.api.new_agent("alice")
    memory = await world.api.remember(agent, key="region", value="eu-west-1 for billing")
    return Fixtures(agent, memory["id"])


async def test_reads_run_on_the_standby_and_are_audited_on_the_primary(
    world: World, facts: Fixtures
) -> None:
    reader, agent = world.reader, facts.agent
    searches_before = _audited(world.owner_url, "memory.search")
    found = await _on_replica(reader, agent, "POST", "/v1/memories/search", json=QUERY)
    assert _search_ids(found) == [facts.memory_id]
    got = await _on_replica(reader, agent, "GET", f"/v1/memories/{facts.memory_id}")
    assert got["value"] == "eu-west-1 for billing"
    listed = await _on_replica(reader, agent, "GET", "/v1/memories")
    assert [item["id"] for item in listed["items"]] == [facts.memory_id]
    # The standby holds the reader's connections; the rows of the reads are on the primary's
    # chain (one per successful search, at least the one served by the standby).
    assert _standby_sessions(world.standby_owner_url) >= 1
    assert _audited(world.owner_url, "memory.search") > searches_before
    # A write goes to the primary (the standby would refuse it) and is never counted there.
    served = _replica(reader).served
    written = await reader.http.post(
        "/v1/memories",
        json={"subject": "service:billing", "kind": "fact", "key": "owner", "value": "ops"}
        | {"new_key": True},
        headers=agent.headers,
    )
    assert written.status_code == 201, written.text
    assert _replica(reader).served == served
    # Read-your-writes: the reader's next search finds its own write, wherever it runs.
    again = await reader.http.post(
        "/v1/memories/search", json={"query": "ops"}, headers=agent.headers
    )
    assert written.json()["memory"]["id"] in _search_ids(again.json())


async def test_paused_replay_is_never_served_beyond_the_bound(
    world: World, facts: Fixtures
) -> None:
    agent, api = facts.agent, world.api
    doomed = await api.new_agent("mallory")
    # Both readers are on the standby (and it has replayed everything so far) ...
    await _on_replica(world.reader, agent, "POST", "/v1/memories/search", json=QUERY)
    await _on_replica(world.lenient, agent, "POST", "/v1/memories/search", json=QUERY)
    await _on_replica(world.lenient, doomed, "GET", "/v1/memories")
    with psycopg.connect(world.standby_owner_url, autocommit=True) as conn:
        conn.execute("SELECT pg_wal_replay_pause()")
    try:
        # ... then another process deletes the memory and disables a client on the primary.
        deleted = await api.http.delete(f"/v1/memories/{facts.memory_id}", headers=agent.headers)
        assert deleted.status_code == 204, deleted.text
        disabled = await api.http.post(
            f"/v1/clients/{doomed.client_id}/disable", headers=api.admin.headers
        )
        assert disabled.status_code == 200, disabled.text
        changed = time.monotonic()
        await asyncio.sleep(BOUND_MS / 1000 + 0.05)
        assert time.monotonic() - changed > BOUND_MS / 1000

        # Past the bound, the reader never answers from the paused standby.
        behind = _replica(world.reader).fallbacks["behind"]
        found = await world.reader.http.post(
            "/v1/memories/search", json=QUERY, headers=agent.headers
        )
        assert found.status_code == 200, found.text
        assert facts.memory_id not in _search_ids(found.json())
        gone = await world.reader.http.get(f"/v1/memories/{facts.memory_id}", headers=agent.headers)
        assert gone.status_code == 404, gone.text
        refused = await world.reader.http.get("/v1/memories", headers=doomed.headers)
        assert refused.status_code == 401, refused.text
        assert _replica(world.reader).fallbacks["behind"] >= behind + 2

        # What the standby itself still holds: a reader allowing a minute's staleness is
        # served the deleted memory and lets the disabled client in (that is the bound's
        # meaning, and proof that these answers came from the standby).
        stale = await world.lenient.http.post(
            "/v1/memories/search", json=QUERY, headers=agent.headers
        )
        assert facts.memory_id in _search_ids(stale.json())
        let_in = await world.lenient.http.get("/v1/memories", headers=doomed.headers)
        assert let_in.status_code == 200, let_in.text
    finally:
        with psycopg.connect(world.standby_owner_url, autocommit=True) as conn:
            conn.execute("SELECT pg_wal_replay_resume()")
    # Replay resumed: the reader is on the standby again, and it has the deletion.
    after = await _on_replica(world.reader, agent, "POST", "/v1/memories/search", json=QUERY)
    assert facts.memory_id not in _search_ids(after)


async def _node(
    world: World, data_dir: Path, embedder: Embedder, read_url: str, **auth: Any
) -> Any:
    """One more runtime on the module's primary, reading from `read_url` (closed by the caller)."""
    settings = make_settings(world.owner_url, data_dir, **auth)
    database = replace(settings.database, read_url=read_url, read_replica_max_lag_ms=BOUND_MS)
    settings = replace(settings, database=database)
    return await build_runtime(
        settings, app_login(world.owner_url), embedder, owner_url=world.owner_url
    )


async def test_other_issuers_tokens_are_routed_in_their_naming_statement(
    world: World, facts: Fixtures, idp: FakeIdp, embedder: Embedder, tmp_path: Path
) -> None:
    """A token of an external IdP has no one-statement entrance: the naming statement the call
    runs first carries the freshness check instead, and the principal is then resolved on the
    standby."""
    issuers = (ExternalIssuer(issuer=IDP, audience="memgate", jwks_url=idp.url),)
    runtime = await _node(
        world,
        tmp_path,
        embedder,
        _on_port(app_login(world.owner_url), world.pair.standby_port),
        external_issuers=issuers,
    )
    try:
        async with AsyncTestClient(app=create_app(runtime), base_url=PUBLIC_URL) as client:
            mapped = await client.post(
                "/v1/principals",
                json={
                    "display_name": "external user",
                    "kind": "user",
                    "external_issuer": IDP,
                    "external_subject": SUBJECT,
                },
                headers=world.api.admin.headers,
            )
            assert mapped.status_code == 201, mapped.text
            token = sign(idp.es256, idp_claims(world.api.tenant_id))
            external = Agent("", "", "", token)
            listed = await _on_replica(Node(runtime, client), external, "GET", "/v1/memories")
            assert listed["items"] == []  # the IdP's user sees none of alice's memories
    finally:
        await runtime.close()


async def test_a_primary_named_as_the_replica_is_never_read_as_one(
    world: World, facts: Fixtures, embedder: Embedder, tmp_path: Path
) -> None:
    """MEMGATE_READ_DATABASE_URL naming a server that is not in recovery: the freshness column
    is NULL, the call runs on the primary (where it would have anyway), and the replica is not
    asked again for a while."""
    primary_again = app_login(world.owner_url) + "?application_name=not-a-standby"
    runtime = await _node(world, tmp_path, embedder, primary_again)
    replica = runtime.replica
    assert replica is not None
    try:
        async with AsyncTestClient(app=create_app(runtime), base_url=PUBLIC_URL) as client:
            deadline = time.monotonic() + WAIT_SECONDS
            while not replica.fallbacks["not-a-standby"]:
                assert time.monotonic() < deadline, replica.fallbacks
                listed = await client.get("/v1/memories", headers=facts.agent.headers)
                assert listed.status_code == 200, listed.text
                await asyncio.sleep(0.02)
            again = await client.get("/v1/memories", headers=facts.agent.headers)
            assert again.status_code == 200, again.text
        assert (replica.served, replica.fallbacks["not-a-standby"]) == (0, 1)
        assert replica.fallbacks["replica-failed-recently"] == 1
    finally:
        await runtime.close()


async def test_a_stopped_standby_leaves_reads_answered_by_the_primary(
    world: World, facts: Fixtures
) -> None:
    reader, agent = world.reader, facts.agent
    await _on_replica(reader, agent, "GET", "/v1/memories")
    # What the primary lists (which memories earlier tests left depends on where xdist ran
    # them: the module's fixtures are per worker).
    on_primary = await world.writer.http.get("/v1/memories", headers=agent.headers)
    assert on_primary.status_code == 200, on_primary.text
    expected = [item["id"] for item in on_primary.json()["items"]]
    world.pair.stop_standby()  # blocks the loop: the sampler samples again first
    await asyncio.sleep(BOUND_MS / 1000)
    replica = _replica(reader)
    served, failed = replica.served, replica.fallbacks["replica-failed"]
    for _ in range(3):
        listed = await reader.http.get("/v1/memories", headers=agent.headers)
        assert listed.status_code == 200, listed.text
        assert [item["id"] for item in listed.json()["items"]] == expected
    assert replica.served == served
    # The first read found the standby gone; the next ones did not try it again.
    assert replica.fallbacks["replica-failed"] == failed + 1, replica.fallbacks
    assert replica.fallbacks["replica-failed-recently"] >= 2
