"""A replayed batch answer is shown only to a caller who may still read every memory it names
and write where they were written: a revoked grant, an expired memory or a write grant taken
away answers 410 `idempotency-answer-gone` (saying nothing more than for a deleted memory)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from sqlalchemy import text

from tests.fixtures.api import Agent, Api
from tests.integration.jobs.support import grant, new_space, revoke
from tests.integration.memory.support import as_owner, assert_problem, count_memories

BATCH = "/v1/memories:batch"
SECRET = "the launch code is 0451"


def _item(space_id: str | None = None, **fields: object) -> dict[str, object]:
    body: dict[str, object] = {
        "subject": "service:billing",
        "kind": "fact",
        "key": "launch.code",
        "value": SECRET,
        "new_key": True,
    }
    if space_id is not None:
        body["space_id"] = space_id
    return body | fields


async def _writer_of_a_team_space(api: Api) -> tuple[str, Agent]:
    space_id = await new_space(api, "team")
    alice = await api.new_agent("alice")
    for action in ("read", "write"):
        await grant(api, space_id, action, f"user:{alice.principal_id}")
    return space_id, alice


async def _replay_is_gone(api: Api, alice: Agent, key: str, body: Mapping[str, object]) -> str:
    before = await count_memories(api.runtime)
    again = await api.http.post(BATCH, json=body, headers={**alice.headers, "Idempotency-Key": key})
    problem = assert_problem(again, 410, "idempotency-answer-gone")
    assert SECRET not in again.text
    assert "Idempotent-Replayed" not in again.headers
    assert await count_memories(api.runtime) == before
    return str(problem["detail"])


async def test_a_revoked_grant_does_not_replay_the_spaces_values(api: Api) -> None:
    space_id, alice = await _writer_of_a_team_space(api)
    body = {"items": [_item(space_id)]}
    headers = {**alice.headers, "Idempotency-Key": "k-1"}
    first = await api.http.post(BATCH, json=body, headers=headers)
    assert first.status_code == 201, first.text
    replayed = await api.http.post(BATCH, json=body, headers=headers)  # still hers: replayed
    assert replayed.status_code == 201
    assert replayed.headers["Idempotent-Replayed"] == "true"
    memory_id = first.json()["items"][0]["memory"]["id"]
    for action in ("read", "write"):
        await revoke(api, space_id, action, f"user:{alice.principal_id}")
    read = await api.http.get(f"/v1/memories/{memory_id}", headers=alice.headers)
    assert read.status_code == 404, read.text
    revoked = await _replay_is_gone(api, alice, "k-1", body)
    # The same words as for a memory that was deleted: the 410 tells nothing about why.
    deleted_body = {"items": [_item(key="deleted.one")]}
    gone = await api.http.post(
        BATCH, json=deleted_body, headers={**alice.headers, "Idempotency-Key": "k-del"}
    )
    assert gone.status_code == 201, gone.text
    deleted = await api.http.delete(
        f"/v1/memories/{gone.json()['items'][0]['memory']['id']}", headers=alice.headers
    )
    assert deleted.status_code == 204, deleted.text
    assert await _replay_is_gone(api, alice, "k-del", deleted_body) == revoked


async def test_a_caller_who_may_no_longer_write_there_gets_no_replay(api: Api) -> None:
    space_id, alice = await _writer_of_a_team_space(api)
    body = {"items": [_item(space_id)]}
    first = await api.http.post(BATCH, json=body, headers={**alice.headers, "Idempotency-Key": "w"})
    assert first.status_code == 201, first.text
    await revoke(api, space_id, "write", f"user:{alice.principal_id}")
    read = await api.http.get(
        f"/v1/memories/{first.json()['items'][0]['memory']['id']}", headers=alice.headers
    )
    assert read.status_code == 200, read.text  # she still reads it, but a write would be refused
    await _replay_is_gone(api, alice, "w", body)


async def test_an_expired_memory_does_not_come_back_through_a_replay(api: Api) -> None:
    alice = await api.new_agent("alice")
    body = {"items": [_item(ttl_seconds=1)]}
    first = await api.http.post(BATCH, json=body, headers={**alice.headers, "Idempotency-Key": "t"})
    assert first.status_code == 201, first.text
    memory_id = first.json()["items"][0]["memory"]["id"]
    await asyncio.sleep(1.2)  # the memory's 1 s TTL passes (the sweep has not run)
    read = await api.http.get(f"/v1/memories/{memory_id}", headers=alice.headers)
    assert read.status_code == 404, read.text
    await _replay_is_gone(api, alice, "t", body)


async def test_expiring_a_memory_in_place_drops_the_stored_answer(api: Api) -> None:
    """What `memory.age_unused` does (expires_at = now(), no new version): the stored body
    goes at once, as on a delete, instead of waiting for the TTL sweep."""
    alice = await api.new_agent("alice")
    body = {"items": [_item()]}
    first = await api.http.post(BATCH, json=body, headers={**alice.headers, "Idempotency-Key": "a"})
    assert first.status_code == 201, first.text
    async with as_owner(api.runtime) as conn:
        await conn.execute(
            text("UPDATE memories SET expires_at = now() + interval '1 hour' WHERE tenant_id = :t"),
            {"t": api.tenant_id},
        )
        later = await conn.scalar(text("SELECT count(answer) FROM idempotency_keys"))
        await conn.execute(
            text("UPDATE memories SET expires_at = now() WHERE tenant_id = :t"),
            {"t": api.tenant_id},
        )
        now = await conn.scalar(text("SELECT count(answer) FROM idempotency_keys"))
        await conn.commit()
    assert (later, now) == (1, 0)  # a later expiry keeps it; an expiry now drops it
