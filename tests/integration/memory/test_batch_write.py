"""`POST /v1/memories:batch`: all or nothing, one audit row with counts, per-item problems, and
idempotency keys (replay, reuse with another body, in flight), through the real app and
database."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from service.auth.principal import Principal
from service.calls import Call, Facts
from service.memory.schemas import MemoryBatch, MemoryCreate
from service.memory.service import MemoryService
from service.problems import PROBLEM_BASE_URI
from tests.fixtures.api import Agent, Api
from tests.integration.memory.support import as_owner, assert_problem, count_memories

BATCH = "/v1/memories:batch"


def item(key: str, value: str | None = None, **fields: Any) -> dict[str, Any]:
    return {
        "subject": "service:billing",
        "kind": "fact",
        "key": key,
        "value": value or f"the {key} fact",
        "new_key": True,
    } | fields


async def batch(api: Api, agent: Agent, items: list[dict[str, Any]], key: str | None = None) -> Any:
    headers = dict(agent.headers)
    if key is not None:
        headers["Idempotency-Key"] = key
    return await api.http.post(BATCH, json={"items": items}, headers=headers)


async def batch_rows(api: Api) -> list[dict[str, Any]]:
    async with as_owner(api.runtime) as conn:
        result = await conn.execute(
            text(
                "SELECT action, decision, status, reason, result_count, target_ids "
                "FROM audit_events WHERE tenant_id = :t AND action LIKE 'memory.write%' "
                "ORDER BY seq"
            ),
            {"t": api.tenant_id},
        )
        return [dict(row) for row in result.mappings().all()]


async def test_a_batch_writes_every_item_in_order_with_one_audit_row(api: Api) -> None:
    alice = await api.new_agent("alice")
    old = await api.remember(alice, key="plan", value="the old plan")
    response = await batch(
        api, alice, [item("a"), item("plan", "the new plan"), item("b", metadata={"n": 1})]
    )
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["count"] == 3
    assert [one["memory"]["key"] for one in body["items"]] == ["a", "plan", "b"]
    assert body["items"][1]["superseded"] == [old["id"]]
    assert body["items"][2]["memory"]["metadata"] == {"n": 1}
    # Each answer is exactly the single write's: same fields.
    single = await api.http.post("/v1/memories", json=item("c"), headers=alice.headers)
    assert set(body["items"][0]) | {"audience_narrowed", "reverted"} >= set(single.json())
    assert set(body["items"][0]["memory"]) == set(single.json()["memory"])
    rows = [row for row in await batch_rows(api) if row["action"] == "memory.write_batch"]
    assert len(rows) == 1
    [row] = rows
    assert (row["decision"], row["status"], row["result_count"]) == ("allow", 201, 3)
    assert row["reason"] == "batch:items=3,created=3,superseded=1"
    ids = {uuid.UUID(one["memory"]["id"]) for one in body["items"]} | {uuid.UUID(old["id"])}
    assert set(row["target_ids"]) == ids


async def test_one_bad_item_writes_nothing_and_names_every_bad_item(api: Api) -> None:
    alice = await api.new_agent("alice")
    before = await count_memories(api.runtime)
    rows_before = await batch_rows(api)
    items = [
        item("a"),
        item("b", space_id=str(uuid.uuid4())),  # a space nobody can write: 404 per item
        item("c"),
        item("d", value="x" * 20_000),  # over MEMGATE_MAX_VALUE_CHARS
    ]
    response = await batch(api, alice, items)
    body = assert_problem(response, 422, "batch-rejected")
    assert [(e["index"], e["status"], e["type"]) for e in body["errors"]] == [
        (1, 404, PROBLEM_BASE_URI + "space-not-found"),
        (3, 422, PROBLEM_BASE_URI + "value-too-long"),
    ]  # every check that needs no vector, for every item, before anything is embedded
    items[3] = item("d")
    response = await batch(api, alice, items)
    body = assert_problem(response, 422, "batch-rejected")
    assert [(e["index"], e["status"], e["type"]) for e in body["errors"]] == [
        (1, 404, PROBLEM_BASE_URI + "space-not-found")
    ]
    assert body["errors"][0]["title"] == "Space not found"
    assert body["errors"][0]["detail"]
    assert await count_memories(api.runtime) == before
    new_rows = (await batch_rows(api))[len(rows_before) :]
    assert [(r["action"], r["decision"], r["status"], r["reason"]) for r in new_rows] == [
        ("memory.write_batch", "deny", 422, "batch-rejected")
    ] * 2
    assert all(r["target_ids"] == [] for r in new_rows)


async def test_items_that_do_not_decode_are_all_listed(api: Api) -> None:
    alice = await api.new_agent("alice")
    before = await count_memories(api.runtime)
    bad = [item("a"), {"subject": "s", "kind": "nonsense", "key": "k", "value": "v"}, item("c")]
    bad.append(item("d", space_id="not-a-uuid"))
    bad.append({**item("e"), "surprise": 1})
    body = assert_problem(await batch(api, alice, bad), 422, "batch-rejected")
    assert [(e["index"], e["status"]) for e in body["errors"]] == [(1, 422), (3, 400), (4, 422)]
    assert body["errors"][1]["type"] == PROBLEM_BASE_URI + "malformed-id"
    assert "surprise" in body["errors"][2]["detail"]
    assert await count_memories(api.runtime) == before
    # The shell itself: no items, too many items, not a list.
    assert_problem(await batch(api, alice, []), 422, "invalid-request")
    many = [item(f"k{i}") for i in range(501)]
    tooo_many = assert_problem(await batch(api, alice, many), 422, "invalid-request")
    assert tooo_many["max_items"] == 500
    response = await api.http.post(BATCH, json={"items": {}}, headers=alice.headers)
    assert_problem(response, 422, "invalid-request")
    assert await count_memories(api.runtime) == before


async def test_a_write_gate_refusal_inside_the_batch_rejects_it(api: Api) -> None:
    alice = await api.new_agent("alice")
    await api.remember(alice, key="deploy.window", value="fridays")
    before = await count_memories(api.runtime)
    gated = item("deploy.slot", "mondays", new_key=False)
    body = assert_problem(await batch(api, alice, [item("x"), gated]), 422, "batch-rejected")
    assert [(e["index"], e["status"]) for e in body["errors"]] == [(1, 409)]
    assert body["errors"][0]["type"] == PROBLEM_BASE_URI + "key-choice-required"
    assert await count_memories(api.runtime) == before


async def test_an_idempotency_key_replays_the_first_answer_and_writes_once(api: Api) -> None:
    alice = await api.new_agent("alice")
    items = [item("a"), item("b")]
    first = await batch(api, alice, items, key="import-0001")
    assert first.status_code == 201, first.text
    assert "idempotent-replayed" not in first.headers
    after_first = await count_memories(api.runtime)
    again = await batch(api, alice, items, key="import-0001")
    assert again.status_code == 201, again.text
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json() == first.json()
    assert await count_memories(api.runtime) == after_first
    rows = [r for r in await batch_rows(api) if r["action"] == "memory.write_batch"]
    assert [(r["status"], r["reason"], r["result_count"]) for r in rows] == [
        (201, "batch:items=2,created=2,superseded=0", 2),
        (201, "idempotent-replay:items=2", 2),
    ]
    # Another body under the key: 422, nothing written.
    reused = await batch(api, alice, [item("c")], key="import-0001")
    assert_problem(reused, 422, "idempotency-key-reused")
    assert await count_memories(api.runtime) == after_first
    # The key is the caller's own: another client's same key is a fresh request.
    bob = await api.new_agent("bob")
    theirs = await batch(api, bob, items, key="import-0001")
    assert theirs.status_code == 201
    assert "idempotent-replayed" not in theirs.headers
    # A malformed key is refused before anything happens.
    assert_problem(await batch(api, alice, items, key="has space"), 422, "invalid-request")


async def test_a_key_in_flight_answers_409(api: Api) -> None:
    alice = await api.new_agent("alice")
    name = f"idem|{api.tenant_id}|{alice.principal_id}|{alice.client_id}|busy"
    async with as_owner(api.runtime) as conn:
        await conn.execute(text("SELECT pg_advisory_lock(hashtextextended(:n, 0))"), {"n": name})
        before = await count_memories(api.runtime)
        response = await batch(api, alice, [item("a")], key="busy")
        assert_problem(response, 409, "idempotency-key-in-flight")
        assert response.headers["retry-after"] == "1"
        assert await count_memories(api.runtime) == before
        await conn.execute(text("SELECT pg_advisory_unlock(hashtextextended(:n, 0))"), {"n": name})
    done = await batch(api, alice, [item("a")], key="busy")
    assert done.status_code == 201, done.text


async def test_concurrent_calls_with_one_key_write_once(api: Api) -> None:
    alice = await api.new_agent("alice")
    before = await count_memories(api.runtime)
    answers = await asyncio.gather(
        *(batch(api, alice, [item("same")], key="twice") for _ in range(3))
    )
    statuses = sorted(response.status_code for response in answers)
    assert statuses[0] == 201, statuses
    assert set(statuses) <= {201, 409}, statuses
    assert await count_memories(api.runtime) == before + 1


async def test_a_deleted_memory_takes_its_stored_answer_with_it(api: Api) -> None:
    alice = await api.new_agent("alice")
    first = await batch(api, alice, [item("a", "a value to forget")], key="gone")
    memory_id = first.json()["items"][0]["memory"]["id"]
    deleter = await api.access_token(alice.client_id, alice.secret)
    deleted = await api.http.delete(
        f"/v1/memories/{memory_id}", headers={"Authorization": f"Bearer {deleter}"}
    )
    assert deleted.status_code == 204, deleted.text
    async with as_owner(api.runtime) as conn:
        kept = (await conn.execute(text("SELECT answer FROM idempotency_keys"))).scalars().all()
    assert kept == [None]
    before = await count_memories(api.runtime)
    again = await batch(api, alice, [item("a", "a value to forget")], key="gone")
    body = assert_problem(again, 410, "idempotency-answer-gone")
    assert "a value to forget" not in again.text
    assert body["detail"]
    assert await count_memories(api.runtime) == before


async def test_the_batch_spends_one_embedding_call_per_item(api: Api) -> None:
    platform = await Api.platform(api.http, api.runtime)
    limits = await api.http.put(
        f"/v1/tenants/{api.tenant_id}/limits",
        json={"embedding_calls_per_minute": 3},
        headers=platform.admin.headers,
    )
    assert limits.status_code == 200, limits.text
    api.runtime.quotas.forget()
    alice = await api.new_agent("alice")
    before = await count_memories(api.runtime)
    done = await batch(api, alice, [item(f"k{i}") for i in range(3)])
    assert done.status_code == 201, done.text
    # The three items spent the minute's three embedding calls: one more item is refused.
    refused = await batch(api, alice, [item("one-more")])
    assert_problem(refused, 429, "rate-limited")
    assert await count_memories(api.runtime) == before + 3


async def test_a_batch_larger_than_the_embedding_quota_is_refused_not_told_to_retry(
    api: Api,
) -> None:
    """More items than the tenant's embedding calls per minute can never be admitted (the
    bucket never holds that many): 422 naming the largest batch, not a 429 retried forever."""
    platform = await Api.platform(api.http, api.runtime)
    limits = await api.http.put(
        f"/v1/tenants/{api.tenant_id}/limits",
        json={"embedding_calls_per_minute": 3},
        headers=platform.admin.headers,
    )
    assert limits.status_code == 200, limits.text
    api.runtime.quotas.forget()
    alice = await api.new_agent("alice")
    before = await count_memories(api.runtime)
    refused = await batch(api, alice, [item(f"q{i}") for i in range(4)])
    body = assert_problem(refused, 422, "invalid-request")
    assert body["max_items"] == 3
    assert "retry-after" not in refused.headers
    # The refusal spent none of the minute's calls: a batch of the size it named passes.
    done = await batch(api, alice, [item(f"q{i}") for i in range(3)])
    assert done.status_code == 201, done.text
    assert await count_memories(api.runtime) == before + 3


async def test_the_mcp_tool_writes_a_batch_like_rest(api: Api) -> None:
    from tests.integration.mcp.support import error_text, mcp_session, payload, serving

    alice = await api.new_agent("alice")
    before = await count_memories(api.runtime)
    async with serving(api.runtime) as base, mcp_session(base, alice.token) as session:
        written = payload(
            await session.call_tool("remember_many", {"items": [item("m1"), item("m2")]})
        )
        refused = await session.call_tool(
            "remember_many", {"items": [item("m3"), item("m4", space_id=str(uuid.uuid4()))]}
        )
    assert written["count"] == 2
    assert [one["memory"]["key"] for one in written["items"]] == ["m1", "m2"]
    assert refused.structured_content is not None
    assert refused.structured_content["type"] == PROBLEM_BASE_URI + "batch-rejected"
    assert [e["index"] for e in refused.structured_content["errors"]] == [1], error_text(refused)
    assert await count_memories(api.runtime) == before + 2


async def test_a_key_repeated_in_one_batch_chains_each_write_onto_the_one_before(
    api: Api,
) -> None:
    alice = await api.new_agent("alice")
    old = await api.remember(alice, key="plan", value="plan 0")
    items = [item("plan", f"plan {n}", new_key=False) for n in (1, 2, 3)]
    response = await batch(api, alice, [*items[:2], item("other"), items[2]])
    assert response.status_code == 201, response.text
    written = [one for one in response.json()["items"] if one["memory"]["key"] == "plan"]
    ids = [old["id"], *(one["memory"]["id"] for one in written)]
    # Each write is answered as written (live then), superseding the one before it.
    assert [one["superseded"] for one in written] == [[i] for i in ids[:3]]
    assert [one["memory"]["version"] for one in written] == [2, 3, 4]
    assert [one["memory"]["supersedes"] for one in written] == ids[:3]
    history = await api.http.get(f"/v1/memories/{ids[3]}/history", headers=alice.headers)
    assert history.status_code == 200, history.text
    chain = history.json()["items"]
    assert [(v["id"], v["value"]) for v in chain] == [
        (i, f"plan {n}") for n, i in reversed(list(enumerate(ids)))
    ]
    assert [v["superseded_by"] for v in chain] == [None, *ids[3:0:-1]]
    assert [v["status"] for v in chain] == ["live", "superseded", "superseded", "superseded"]
    live = await api.http.get("/v1/memories", params={"key": "plan"}, headers=alice.headers)
    assert [m["id"] for m in live.json()["items"]] == [ids[3]]
    [row] = [r for r in await batch_rows(api) if r["action"] == "memory.write_batch"]
    assert row["reason"] == "batch:items=4,created=4,superseded=3"


async def test_the_gate_of_a_later_item_counts_the_keys_earlier_items_wrote(api: Api) -> None:
    alice = await api.new_agent("alice")
    before = await count_memories(api.runtime)
    gated = [item(key, f"{key} value", new_key=False) for key in ("first", "second")]
    body = assert_problem(await batch(api, alice, gated), 422, "batch-rejected")
    assert [(e["index"], e["status"]) for e in body["errors"]] == [(1, 409)]
    assert "first" in body["errors"][0]["detail"]
    assert await count_memories(api.runtime) == before
    # The same key twice passes: the second write updates the first.
    again = await batch(api, alice, [gated[0], gated[0]])
    assert again.status_code == 201, again.text
    assert await count_memories(api.runtime) == before + 2


async def test_two_batches_of_the_same_keys_in_opposite_orders_both_commit(api: Api) -> None:
    """Two real calls, each on its own connection, writing the same keys in opposite orders
    at once: each batch takes its key locks in one sorted order, so the second waits for the
    first to commit and then supersedes its versions. (Taking them item by item, each call
    held half the locks the other needed: a deadlock, answered 500.)"""
    alice = await api.new_agent("alice")
    keys = [f"shared.{n:02}" for n in range(40)]
    forward = MemoryBatch(items=[MemoryCreate(**item(key, "forward")) for key in keys])
    backward = MemoryBatch(items=[MemoryCreate(**item(key, "back")) for key in reversed(keys)])
    racers = [_racer(api, alice) for _ in range(2)]
    try:
        running = {
            asyncio.create_task(service.write_batch(caller, body)): session
            for (service, caller, session), body in zip(racers, (forward, backward), strict=True)
        }
        pending = set(running)
        while pending:
            done, pending = await asyncio.wait(pending, timeout=30, return_when="FIRST_COMPLETED")
            assert done, "neither batch finished"
            for task in done:
                assert task.result().count == len(keys)
                await running[task].commit()
    finally:
        for _, _, session in racers:
            await session.rollback()
            await session.close()
    listed = await api.http.get(
        "/v1/memories", params={"subject": "service:billing", "limit": "100"}, headers=alice.headers
    )
    live = listed.json()["items"]
    assert sorted(m["key"] for m in live) == keys  # one live version per key
    assert {m["version"] for m in live} == {2}  # the second batch superseded the first


def _racer(api: Api, agent: Agent) -> tuple[MemoryService, Principal, AsyncSession]:
    """A memory service on a call of its own (its own connection and transaction)."""
    caller = Principal(
        tenant_id=uuid.UUID(api.tenant_id),
        principal_id=uuid.UUID(agent.principal_id),
        client_id=agent.client_id,
        scopes=frozenset({"read:memory", "write:memory"}),
        token_id="test",
        issuer="test",
    )
    session = Call(api.runtime, "memory.write_batch", "POST", BATCH, caller=caller).db
    limits = api.runtime.settings.memory
    return MemoryService(session, api.runtime.embedder, limits, facts=Facts()), caller, session


async def test_text_that_arrays_would_quote_round_trips(api: Api) -> None:
    # The insert carries each column as one array: quotes, braces, commas, backslashes,
    # NULL-looking words and non-ASCII text must come back exactly as sent.
    alice = await api.new_agent("alice")
    value = "a \"quoted\" {brace}, a back\\slash, NULL, 'single' and ünïcode ✓"
    sent = item("tricky", value, subject='svc:"{x,y}\\', metadata={"k": 'v "{}"', "n": None})
    response = await batch(api, alice, [sent, item("plain")])
    assert response.status_code == 201, response.text
    memory_id = response.json()["items"][0]["memory"]["id"]
    stored = await api.http.get(f"/v1/memories/{memory_id}", headers=alice.headers)
    got = stored.json()
    assert (got["value"], got["subject"], got["metadata"]) == (
        value,
        sent["subject"],
        sent["metadata"],
    )
