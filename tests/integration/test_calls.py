"""The call as the unit of work (service/calls.py): one pooled connection per call, the caller
checked and named in the call's own transaction, read-only operations refused any write, and
reads' audit rows group-committed — durable before the answer, in chain order."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import httpx
import psycopg
import pytest
from litestar.testing import AsyncTestClient
from sqlalchemy import event, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from service.app import create_app
from service.audit.group_commit import ReadAuditQueue
from service.auth.tokens import VerifiedToken
from service.calls import open_call
from service.db.session import PREPARE_THRESHOLD, PREPARED_MAX
from service.embeddings import Embedder
from service.embeddings.http import HttpEmbedder
from service.memory import operations as memory_ops
from service.memory.problems import MemoryNotFound
from service.problems import ServiceUnavailable
from service.runtime import build_runtime
from service.settings import Settings
from tests.conftest import PUBLIC_URL
from tests.fixtures.api import Api
from tests.fixtures.canaries import captured_logs
from tests.fixtures.postgres import app_login
from tests.integration.audit.support import audit_rows, owner_execute
from tests.integration.memory.support import scalar


@contextmanager
def watched(engine: AsyncEngine) -> Iterator[dict[str, Any]]:
    """Statements and pool checkouts of `engine` while the block runs."""
    seen: dict[str, Any] = {"statements": [], "checkouts": 0}

    def on_execute(_c: Any, _cur: Any, statement: str, *_: Any) -> None:
        seen["statements"].append(" ".join(statement.split())[:4000])

    def on_checkout(*_: Any) -> None:
        seen["checkouts"] += 1

    sync = engine.sync_engine
    event.listen(sync, "before_cursor_execute", on_execute)
    event.listen(sync.pool, "checkout", on_checkout)
    try:
        yield seen
    finally:
        event.remove(sync, "before_cursor_execute", on_execute)
        event.remove(sync.pool, "checkout", on_checkout)


async def test_a_search_takes_one_connection_and_names_and_checks_its_caller_in_it(
    api: Api,
) -> None:
    alice = await api.new_agent("alice")
    await api.remember(alice, value="the billing service is owned by team payments")
    with watched(api.runtime.engine) as seen, watched(api.runtime.read_audit.engine) as group:
        response = await api.search(alice, "who owns billing")
    assert response.status_code == 200, response.text
    assert [hit["memory"]["value"] for hit in response.json()["hits"]] == [
        "the billing service is owned by team payments"
    ]
    statements = seen["statements"]
    # One connection of the call pool; the row goes through the group commit's own pool.
    assert seen["checkouts"] == 1, statements
    # The first statement names the caller and checks principal and client, in one round trip.
    first = statements[0]
    assert first.startswith("SELECT set_config"), statements
    assert "transaction_read_only" in first
    assert "FROM principals JOIN clients" in first
    assert not any("FROM principals" in s for s in statements[1:]), statements
    assert not any("audit_append" in s for s in statements)
    assert sum("audit_append" in s for s in group["statements"]) == 1


async def _prepared_after_searches(api: Api) -> tuple[list[str], list[str]]:
    """How the transactions of a few more searches than the threshold ended, and the statements
    then prepared on the pool's connection. One client at a time keeps to one pooled
    connection, so that connection has seen each statement of the search that often."""
    alice = await api.new_agent("alice")
    await api.remember(alice, value="the billing service is owned by team payments")
    ended: list[str] = []
    sync = api.runtime.engine.sync_engine
    event.listen(sync, "commit", lambda _c: ended.append("commit"))
    event.listen(sync, "rollback", lambda _c: ended.append("rollback"))
    for _ in range(PREPARE_THRESHOLD + 2):
        response = await api.search(alice, "who owns billing")
        assert response.status_code == 200, response.text
        assert len(response.json()["hits"]) == 1
    searches_ended = ended[-(PREPARE_THRESHOLD + 2) :]
    async with api.runtime.engine.connect() as connection:
        prepared = (
            (
                await connection.execute(
                    text("SELECT statement FROM pg_prepared_statements WHERE NOT from_sql")
                )
            )
            .scalars()
            .all()
        )
    return searches_ended, list(prepared)


async def test_searches_keep_their_statements_prepared_on_the_connection(api: Api) -> None:
    """A read-only call ends with COMMIT (its transaction could write nothing): psycopg forgets a
    connection's prepared statements on ROLLBACK, and the next reads would parse and plan again."""
    ended, prepared = await _prepared_after_searches(api)
    assert ended == ["commit"] * (PREPARE_THRESHOLD + 2)
    assert any("memgate:visible" in statement for statement in prepared), prepared


async def test_a_connection_keeps_a_bounded_number_of_prepared_statements(api: Api) -> None:
    """Each prepared statement holds its plan in the backend's memory (about 0.3 MB for a
    search's): psycopg's default of 100 per connection, on every pooled connection of every
    worker, could reach a gigabyte. Past `PREPARED_MAX` the least recently used one goes."""
    shapes = PREPARED_MAX + 10
    async with api.runtime.engine.connect() as connection:
        for shape in range(shapes):
            statement = text(f"SELECT {shape} AS shape")
            for _ in range(PREPARE_THRESHOLD + 1):
                await connection.execute(statement)
        prepared = (
            await connection.execute(
                text("SELECT count(*) FROM pg_prepared_statements WHERE NOT from_sql")
            )
        ).scalar_one()
        await connection.rollback()
    # psycopg evicts when the next new statement arrives, so the last one prepared is extra.
    assert prepared <= PREPARED_MAX + 1 < shapes


async def test_prepared_statements_can_be_turned_off_for_a_pooler(
    settings: Settings, embedder: Embedder
) -> None:
    """`MEMGATE_DB_PREPARED_STATEMENTS=0`: nothing is prepared on the server (a pooler in
    transaction mode would hand the next transaction a connection that lacks them)."""
    off = replace(settings, database=replace(settings.database, prepared_statements=False))
    runtime = await build_runtime(
        off, app_login(off.database.url), embedder, owner_url=off.database.url
    )
    try:
        async with AsyncTestClient(create_app(runtime)) as http:
            _, prepared = await _prepared_after_searches(await Api.bootstrap(http, runtime))
    finally:
        await runtime.close()
    assert prepared == []


async def test_a_disabled_client_stops_on_its_next_call(api: Api) -> None:
    alice = await api.new_agent("alice")
    assert (await api.search(alice, "anything")).status_code == 200
    disabled = await api.http.post(
        f"/v1/clients/{alice.client_id}/disable", headers=api.admin.headers
    )
    assert disabled.status_code == 200, disabled.text
    refused = await api.search(alice, "anything")
    assert refused.status_code == 401
    assert "rejected" in refused.json()["detail"]


async def test_a_read_only_operation_cannot_write(api: Api) -> None:
    """The database itself refuses: a read operation's transaction is read-only, so a bug that
    made a read write would fail loudly, never be silently rolled back."""
    alice = await api.new_agent("alice")
    verified = await api.runtime.verifier.verify(alice.token)
    with pytest.raises(DBAPIError, match="read-only transaction"):
        async with open_call(
            api.runtime, memory_ops.SEARCH, token=verified, method="POST", route="/t"
        ) as call:
            await call.db.execute(text("CREATE TEMP TABLE scratch (x int)"))


async def test_concurrent_reads_share_commits_and_every_row_is_durable_before_the_answer(
    api: Api, owner_engine: AsyncEngine
) -> None:
    alice = await api.new_agent("alice")
    await api.remember(alice, value="deploys happen on tuesdays")
    queue = api.runtime.read_audit
    before = len(await audit_rows(owner_engine))

    async def search_then_count() -> tuple[int, str]:
        response = await api.search(alice, "when are deploys")
        assert response.status_code == 200, response.text
        request_id = response.headers["x-request-id"]
        # The answer arrived: its row must already be committed, seen from another connection.
        async with owner_engine.connect() as conn:
            found = await conn.scalar(
                text("SELECT count(*) FROM audit_events WHERE request_id = :r"),
                {"r": request_id},
            )
        return int(found or 0), request_id

    results = await asyncio.gather(*(search_then_count() for _ in range(24)))
    assert [found for found, _ in results] == [1] * 24
    rows = await audit_rows(owner_engine)
    assert len(rows) == before + 24
    mine = [row for row in rows if row["tenant_id"] == uuid.UUID(api.tenant_id)]
    assert [row["seq"] for row in mine] == list(range(1, len(mine) + 1))  # the chain is whole
    searches = [row for row in mine if row["action"] == "memory.search"]
    assert len(searches) == 24
    assert all(row["decision"] == "allow" and row["result_count"] == 1 for row in searches)

    # Calls finishing together share a commit (the in-process test client sends requests one
    # at a time, so the sharing is shown with calls opened side by side).
    verified = await api.runtime.verifier.verify(alice.token)
    flushes_before = queue.flushes

    async def one_read(i: int) -> str:
        async with open_call(
            api.runtime, memory_ops.SEARCH, token=verified, method="POST", route="/grouped"
        ) as call:
            await call.db.execute(text("SELECT 1"))
            call.facts.count(i)
            request_id = call.request_id
        async with owner_engine.connect() as conn:
            found = await conn.scalar(
                text("SELECT result_count FROM audit_events WHERE request_id = :r"),
                {"r": request_id},
            )
        assert found == i  # durable once the call is over
        return request_id

    grouped = await asyncio.gather(*(one_read(i) for i in range(24)))
    assert len(set(grouped)) == 24
    assert queue.flushes - flushes_before < 24  # some rows shared a commit


async def test_a_problem_inside_an_open_call_is_audited_as_a_denial(
    api: Api, owner_engine: AsyncEngine
) -> None:
    alice = await api.new_agent("alice")
    verified: VerifiedToken = await api.runtime.verifier.verify(alice.token)

    async def refused() -> None:
        async with open_call(
            api.runtime, memory_ops.WRITE, token=verified, method="POST", route="/t"
        ) as call:
            call.facts.count(3)
            raise MemoryNotFound("no")

    with pytest.raises(MemoryNotFound):
        await refused()
    rows = [r for r in await audit_rows(owner_engine) if r["route"] == "/t"]
    assert [(r["action"], r["decision"], r["status"], r["reason"]) for r in rows] == [
        ("memory.write", "deny", 404, "memory-not-found")
    ]
    assert rows[0]["result_count"] is None


async def test_refused_calls_share_commits_and_each_row_is_durable_before_the_answer(
    api: Api, owner_engine: AsyncEngine
) -> None:
    """A refused call keeps nothing, so its row is group-committed like a read's: a burst of
    refusals shares fsyncs instead of paying one each."""
    alice = await api.new_agent("alice")
    verified = await api.runtime.verifier.verify(alice.token)
    queue = api.runtime.read_audit
    flushes_before = queue.flushes

    ids: dict[int, str] = {}

    async def refuse(i: int) -> None:
        async with open_call(
            api.runtime, memory_ops.WRITE, token=verified, method="POST", route="/refused"
        ) as call:
            await call.db.execute(text("SELECT 1"))
            ids[i] = call.request_id
            raise MemoryNotFound(f"no {i}")

    async def refused(i: int) -> str:
        with pytest.raises(MemoryNotFound):
            await refuse(i)
        request_id = ids[i]
        async with owner_engine.connect() as conn:
            found = await conn.scalar(
                text("SELECT status FROM audit_events WHERE request_id = :r"), {"r": request_id}
            )
        assert found == 404  # durable once the refusal is out
        return request_id

    refusals = await asyncio.gather(*(refused(i) for i in range(24)))
    assert len(set(refusals)) == 24
    assert 1 <= queue.flushes - flushes_before < 24  # grouped, and some shared a commit
    rows = [r for r in await audit_rows(owner_engine) if r["route"] == "/refused"]
    assert sorted(r["request_id"] for r in rows) == sorted(refusals)
    assert {(r["decision"], r["reason"]) for r in rows} == {("deny", "memory-not-found")}


REVOKE_APPEND = (
    "REVOKE EXECUTE ON FUNCTION audit_append(uuid, text, text, text, text, text[], text, "
    "text, text[], text, text, text, uuid[], integer, text, text, integer, bigint) "
    "FROM memgate_app"
)


async def test_reads_falling_back_from_a_failed_group_never_wait_on_their_own_pool(
    settings: Settings, embedder: Embedder, owner_engine: AsyncEngine
) -> None:
    """Red-team: a read kept its connection while its fallback took another from the same
    pool, so as many failed reads as the pool holds waited on each other until the pool timed
    out. Each read gives its connection back before it falls back."""
    small = replace(settings, database=replace(settings.database, pool_size=1))  # 1 + 1 overflow
    runtime = await build_runtime(
        small, app_login(small.database.url), embedder, owner_url=small.database.url
    )
    try:
        async with AsyncTestClient(create_app(runtime)) as http:
            api = await Api.bootstrap(http, runtime, "small")
            alice = await api.new_agent("alice")
            verified = await runtime.verifier.verify(alice.token)
            await owner_execute(owner_engine, REVOKE_APPEND)

            async def one_read() -> str:
                try:
                    async with open_call(
                        runtime, memory_ops.LIST, token=verified, method="GET", route="/t"
                    ) as call:
                        await call.db.execute(text("SELECT 1"))
                except ServiceUnavailable as refused:
                    return refused.detail
                return "answered"

            with captured_logs() as events:
                details = await asyncio.gather(*(one_read() for _ in range(4)))
    finally:
        await runtime.close()
    assert all("could not be recorded" in detail for detail in details), details
    failures = [e for e in events if e.get("event") == "audit_append_failed"]
    assert failures
    assert all(e["error_type"] != "TimeoutError" for e in failures), failures


async def test_a_group_whose_commit_was_not_confirmed_is_not_appended_twice(
    api: Api, owner_engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Red-team: a lost reply to the group's COMMIT (the rows are in) made every read append
    its row again. Now the read answers 503 "outcome unknown", as a write does, and only the
    refusal is added."""
    alice = await api.new_agent("alice")
    verified = await api.runtime.verifier.verify(alice.token)
    real_commit = ReadAuditQueue._commit

    async def commit_then_lose_the_reply(session: AsyncSession) -> None:
        await real_commit(session)
        raise ConnectionError("the reply to COMMIT was lost")

    monkeypatch.setattr(ReadAuditQueue, "_commit", staticmethod(commit_then_lose_the_reply))

    async def one_read() -> None:
        async with open_call(
            api.runtime, memory_ops.LIST, token=verified, method="GET", route="/lost"
        ) as call:
            call.request_id = "lost-reply"
            await call.db.execute(text("SELECT 1"))

    with pytest.raises(ServiceUnavailable, match="outcome is unknown"):
        await one_read()
    rows = [r for r in await audit_rows(owner_engine) if r["request_id"] == "lost-reply"]
    assert sorted((r["decision"], r["reason"]) for r in rows) == [
        ("allow", "ok"),
        ("error", "commit-unconfirmed"),
    ]


async def test_no_connection_waits_in_a_transaction_while_a_remote_provider_answers(
    settings: Settings,
) -> None:
    """A write and a search embed after their first reads; with a provider over the network
    the call's transaction ends before it is asked, so no pooled connection sits idle in a
    transaction (holding its snapshot and locks) for as long as the provider takes."""
    seen_waiting: list[int] = []

    def provider(request: httpx.Request) -> httpx.Response:
        with psycopg.connect(settings.database.url, autocommit=True) as owner:  # visible: ok
            row = owner.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND state LIKE 'idle in transaction%' AND pid <> pg_backend_pid()"
            ).fetchone()
        seen_waiting.append(int(row[0]) if row else -1)
        texts = json.loads(request.content)["input"]
        data = [{"index": i, "embedding": [1.0] + [0.0] * 255} for i in range(len(texts))]
        return httpx.Response(200, content=json.dumps({"data": data}).encode())

    embedder = HttpEmbedder(
        flavor="openai",
        base_url="http://embeddings.invalid",
        model="fake-256",
        dimensions=256,
        retries=0,
        transport=httpx.MockTransport(provider),
    )
    runtime = await build_runtime(
        settings, app_login(settings.database.url), embedder, owner_url=settings.database.url
    )
    try:
        async with AsyncTestClient(create_app(runtime)) as http:
            api = await Api.bootstrap(http, runtime)
            alice = await api.new_agent("alice")
            seen_waiting.clear()
            memory = await api.remember(alice, value="billing deploys on fridays")
            found = await api.search(alice, "when does billing deploy")
    finally:
        await runtime.close()
        await embedder.aclose()
    assert [hit["memory"]["id"] for hit in found.json()["hits"]] == [memory["id"]]
    assert seen_waiting == [0, 0]  # the write's and the search's embedding


async def test_after_a_failover_one_call_answers_503_and_the_next_are_served(
    api: Api, owner_engine: AsyncEngine
) -> None:
    """A restart or failover kills every pooled connection. The call that finds out answers
    503 service-unavailable, saying to retry (it was a bare 500), and the pool has retired the
    other dead connections, so the calls after it are served at once."""
    alice = await api.new_agent("alice")
    await api.remember(alice, value="the billing service is owned by team payments")
    searches = [api.search(alice, "who owns billing") for _ in range(4)]
    assert all(r.status_code == 200 for r in await asyncio.gather(*searches))  # pool warm
    await owner_execute(
        owner_engine,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid() "
        "AND usename <> current_user",
    )
    await asyncio.sleep(0.2)
    answers = [await api.search(alice, "who owns billing") for _ in range(4)]
    first, *rest = answers
    assert first.status_code == 503, first.text
    assert first.headers["retry-after"] == "1"  # every 503 says when to retry
    assert first.headers["content-type"].startswith("application/problem+json")
    assert first.json()["type"].endswith("/service-unavailable")
    assert "Retry" in first.json()["detail"]
    assert [r.status_code for r in rest] == [200, 200, 200]
    assert all(len(r.json()["hits"]) == 1 for r in rest)


STUCK_NOTE = {"subject": "service:billing", "kind": "fact", "value": "v", "new_key": True}


async def test_a_write_stuck_behind_a_lock_is_stopped_by_the_statement_timeout(
    settings: Settings, embedder: Embedder, owner_engine: AsyncEngine
) -> None:
    """Issue 18: every app connection has a statement_timeout (MEMGATE_DB_STATEMENT_TIMEOUT_MS).
    A write waiting for the tenant's audit lock, which a stuck session holds, is stopped and
    answered 503 problem+json, keeping nothing; before, it waited as long as the lock was held
    (here: for ever)."""
    bounded = replace(settings, database=replace(settings.database, statement_timeout_ms=300))
    runtime = await build_runtime(
        bounded, app_login(bounded.database.url), embedder, owner_url=bounded.database.url
    )
    try:
        async with AsyncTestClient(app=create_app(runtime), base_url=PUBLIC_URL) as http:
            api = await Api.bootstrap(http, runtime)
            alice = await api.new_agent("alice")
            lock = "SELECT pg_advisory_lock(hashtextextended('memgate.audit:' || :t, 0))"
            async with owner_engine.connect() as stuck:
                await stuck.execute(text(lock), {"t": api.tenant_id})
                async with asyncio.timeout(10):
                    answer = await http.post(
                        "/v1/memories",
                        json={**STUCK_NOTE, "key": "stuck.write"},
                        headers=alice.headers,
                    )
                await stuck.execute(text("SELECT pg_advisory_unlock_all()"))
            assert answer.status_code == 503, answer.text
            assert answer.headers["content-type"].startswith("application/problem+json")
            assert "Retry-After" in answer.headers
            kept = await scalar(
                runtime,
                "SELECT count(*) FROM memories WHERE tenant_id = :t AND key = 'stuck.write'",
                t=api.tenant_id,
            )
            assert kept == 0
            # The lock gone, the same write goes through on the same pool.
            again = await http.post(
                "/v1/memories", json={**STUCK_NOTE, "key": "stuck.write"}, headers=alice.headers
            )
            assert again.status_code == 201, again.text
    finally:
        await runtime.close()
