"""Safe retries (issue 15): an `Idempotency-Key` on every write operation (write, revert,
delete, batch) replays the first answer, refuses another request under the key, answers 409
while the first call runs, and is forgotten after its 24 hours; through the real app, the real
database and, for a dropped connection, a real uvicorn on loopback."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import msgspec
from sqlalchemy import text

from tests.fixtures.api import Agent, Api
from tests.integration.mcp.support import serving
from tests.integration.memory.support import as_owner, assert_problem, count_memories, scalar

WRITE = "/v1/memories"
KEY = {"subject": "service:billing", "kind": "fact", "key": "deploy.window", "new_key": True}


def _keyed(agent: Agent, key: str, **more: str) -> dict[str, str]:
    return {**agent.headers, "Idempotency-Key": key, **more}


async def _versions(api: Api, key: str = "deploy.window") -> int:
    count: int = await scalar(
        api.runtime,
        "SELECT count(*) FROM memories WHERE tenant_id = :t AND key = :k",
        t=api.tenant_id,
        k=key,
    )
    return count


async def _audit(api: Api, action: str) -> list[tuple[int, str | None]]:
    async with as_owner(api.runtime) as conn:
        result = await conn.execute(
            text(
                "SELECT status, reason FROM audit_events WHERE tenant_id = :t AND action = :a "
                "ORDER BY seq"
            ),
            {"t": api.tenant_id, "a": action},
        )
        return [(int(status), reason) for status, reason in result.all()]


async def test_a_keyed_write_replays_its_first_answer_and_writes_once(api: Api) -> None:
    alice = await api.new_agent("alice")
    body = {**KEY, "value": "deploys on tuesday"}
    first = await api.http.post(WRITE, json=body, headers=_keyed(alice, "w-1"))
    assert first.status_code == 201, first.text
    assert "idempotent-replayed" not in first.headers
    again = await api.http.post(WRITE, json=body, headers=_keyed(alice, "w-1"))
    assert again.status_code == 201, again.text
    assert again.headers["idempotent-replayed"] == "true"
    assert again.content == first.content  # byte for byte
    assert again.headers["etag"] == first.headers["etag"] == first.json()["memory"]["etag"]
    assert await _versions(api) == 1
    # The same body re-serialized (other key order, spacing) is the same request.
    reordered = msgspec.json.encode(dict(reversed(list(body.items()))))
    headers = _keyed(alice, "w-1", **{"Content-Type": "application/json"})
    third = await api.http.post(WRITE, content=b" " + reordered, headers=headers)
    assert third.status_code == 201, third.text
    assert third.headers["idempotent-replayed"] == "true"
    assert await _versions(api) == 1
    assert await _audit(api, "memory.write") == [
        (201, "ok"),
        (201, "idempotent-replay:items=1"),
        (201, "idempotent-replay:items=1"),
    ]


async def test_the_same_key_with_another_request_is_422_and_changes_nothing(api: Api) -> None:
    alice = await api.new_agent("alice")
    written = await api.http.post(
        WRITE, json={**KEY, "value": "deploys on tuesday"}, headers=_keyed(alice, "k")
    )
    assert written.status_code == 201, written.text
    memory_id = written.json()["memory"]["id"]
    before = await count_memories(api.runtime)
    other_body = await api.http.post(
        WRITE, json={**KEY, "value": "deploys on friday"}, headers=_keyed(alice, "k")
    )
    other_route = await api.http.post(f"{WRITE}/{memory_id}/revert", headers=_keyed(alice, "k"))
    other_operation = await api.http.delete(f"{WRITE}/{memory_id}", headers=_keyed(alice, "k"))
    other_precondition = await api.http.post(
        WRITE,
        json={**KEY, "value": "deploys on tuesday"},
        headers=_keyed(alice, "k", **{"If-Match": "*"}),
    )
    for refused in (other_body, other_route, other_operation, other_precondition):
        assert_problem(refused, 422, "idempotency-key-reused")
    assert await count_memories(api.runtime) == before
    live = await api.http.get(f"{WRITE}/{memory_id}", headers=alice.headers)
    assert live.json()["value"] == "deploys on tuesday"
    assert live.json()["status"] == "live"


async def test_simultaneous_identical_keyed_writes_write_one_memory(api: Api) -> None:
    alice = await api.new_agent("alice")
    body = {**KEY, "value": "deploys on tuesday"}
    answers = await asyncio.gather(
        *(api.http.post(WRITE, json=body, headers=_keyed(alice, "twice")) for _ in range(4))
    )
    statuses = sorted(answer.status_code for answer in answers)
    assert set(statuses) <= {201, 409}, statuses
    created = [a for a in answers if a.status_code == 201]
    fresh = [a for a in created if "idempotent-replayed" not in a.headers]
    assert len(fresh) == 1, statuses  # the others were in flight (409) or replays of it
    for answer in created:
        assert answer.content == fresh[0].content
    for busy in (a for a in answers if a.status_code == 409):
        assert_problem(busy, 409, "idempotency-key-in-flight")
    assert await _versions(api) == 1


async def test_an_expired_key_is_a_new_write(api: Api) -> None:
    alice = await api.new_agent("alice")
    body = {**KEY, "value": "deploys on tuesday"}
    first = await api.http.post(WRITE, json=body, headers=_keyed(alice, "old"))
    assert first.status_code == 201, first.text
    async with as_owner(api.runtime) as conn:  # 24 hours pass
        await conn.execute(
            text(
                "UPDATE idempotency_keys SET expires_at = now() - interval '1 second' "
                "WHERE tenant_id = :t AND key = 'old'"
            ),
            {"t": api.tenant_id},
        )
        await conn.commit()
    again = await api.http.post(WRITE, json=body, headers=_keyed(alice, "old"))
    assert again.status_code == 201, again.text
    assert "idempotent-replayed" not in again.headers
    assert again.json()["memory"]["version"] == 2
    assert again.json()["superseded"] == [first.json()["memory"]["id"]]
    assert await _versions(api) == 2
    # The key now stands for the new write: its retry replays that one.
    third = await api.http.post(WRITE, json=body, headers=_keyed(alice, "old"))
    assert third.headers["idempotent-replayed"] == "true"
    assert third.content == again.content


async def test_keyed_revert_and_delete_happen_once(api: Api) -> None:
    alice = await api.new_agent("alice")
    v1 = await api.remember(alice, **KEY, value="deploys on tuesday")
    await api.remember(alice, **KEY, value="deploys on friday")
    revert = f"{WRITE}/{v1['id']}/revert"
    first = await api.http.post(revert, headers=_keyed(alice, "rev"))
    again = await api.http.post(revert, headers=_keyed(alice, "rev"))
    assert first.status_code == again.status_code == 201, again.text
    assert again.headers["idempotent-replayed"] == "true"
    assert again.content == first.content
    assert await _versions(api) == 3
    v3 = first.json()["memory"]["id"]
    deleted = await api.http.delete(f"{WRITE}/{v3}", headers=_keyed(alice, "del"))
    assert deleted.status_code == 204, deleted.text
    retried = await api.http.delete(f"{WRITE}/{v3}", headers=_keyed(alice, "del"))
    assert retried.status_code == 204, retried.text  # not 404: the same delete, answered again
    assert retried.headers["idempotent-replayed"] == "true"
    assert retried.content == b""
    assert await _audit(api, "memory.delete") == [(204, "ok"), (204, "idempotent-replay")]


async def _send_and_drop(port: int, agent: Agent, body: bytes, key: str) -> None:
    """A keyed write whose client goes away before the answer."""
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    request = (
        f"POST {WRITE} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {agent.token}\r\n"
        f"Content-Type: application/json\r\nIdempotency-Key: {key}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    writer.write(request + body)
    await writer.drain()
    writer.close()
    await writer.wait_closed()


async def _settled(api: Api) -> bool:
    """Has the dropped call finished (its audit row is appended when it commits or fails)?"""
    for _ in range(200):  # bounded: 10 s
        if await _audit(api, "memory.write"):
            return True
        await asyncio.sleep(0.05)
    return False


async def test_a_retry_after_a_dropped_connection_answers_the_first_result(api: Api) -> None:
    alice = await api.new_agent("alice")
    body: dict[str, Any] = {**KEY, "value": "deploys on tuesday"}
    async with serving(api.runtime) as base:
        port = int(base.rsplit(":", 1)[1])
        await _send_and_drop(port, alice, msgspec.json.encode(body), "dropped")
        assert await _settled(api)
        [(status, _)] = await _audit(api, "memory.write")
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            retry = await http.post(WRITE, json=body, headers=_keyed(alice, "dropped"))
    assert retry.status_code == 201, retry.text
    if status == 201:  # the first call committed although nobody read its answer
        assert retry.headers["idempotent-replayed"] == "true"
    assert await _versions(api) == 1
    assert [answered for answered, _ in await _audit(api, "memory.write")] == [status, 201]
