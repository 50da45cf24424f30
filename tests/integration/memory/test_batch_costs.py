"""What a refused batch costs and names: nothing of the tenant's embedding quota when it is
refused before its items need a vector (a reserved key, a foreign space, an evidence gate, an
unreadable source) or while its Idempotency-Key is in flight, as a refused single write spends
nothing; and its audit row names no memory when it is rolled back."""

from __future__ import annotations

from sqlalchemy import text

from tests.fixtures.api import Agent, Api
from tests.integration.memory.support import as_owner, count_memories

BATCH = "/v1/memories:batch"


def _item(key: str, **fields: object) -> dict[str, object]:
    return {"subject": "service:billing", "kind": "fact", "key": key, "value": f"the {key} fact",
            "new_key": True} | fields  # fmt: skip


async def _limited(api: Api, **limits: int) -> Agent:
    platform = await Api.platform(api.http, api.runtime)
    answer = await api.http.put(
        f"/v1/tenants/{api.tenant_id}/limits", json=limits, headers=platform.admin.headers
    )
    assert answer.status_code == 200, answer.text
    api.runtime.quotas.forget()
    return await api.new_agent("alice")


async def _audit_rows(api: Api, action: str) -> list[dict[str, object]]:
    async with as_owner(api.runtime) as conn:
        result = await conn.execute(
            text(
                "SELECT decision, status, reason, target_ids FROM audit_events "
                "WHERE tenant_id = :t AND action = :a ORDER BY seq"
            ),
            {"t": api.tenant_id, "a": action},
        )
        return [dict(row) for row in result.mappings().all()]


async def test_a_batch_refused_before_its_vectors_spends_no_embedding_call(api: Api) -> None:
    """Three embedding calls a minute: refused single writes and a batch refused for a reserved
    key, a space that is not there, and a cited id nobody can read spend none of them, so three
    real writes still go through afterwards."""
    alice = await _limited(api, embedding_calls_per_minute=3)
    reserved = _item("consolidation", kind="summary")
    nowhere = _item("elsewhere", space_id="00000000-0000-7000-8000-000000000000")
    unsourced = _item("cites", derived_from=["00000000-0000-7000-8000-000000000001"])
    for bad in (reserved, nowhere, unsourced):
        single = await api.http.post("/v1/memories", json=bad, headers=alice.headers)
        assert 400 <= single.status_code < 500, single.text
    refused = await api.http.post(
        BATCH,
        json={"items": [_item("a"), reserved, nowhere, unsourced, _item("b")]},
        headers=alice.headers,
    )
    assert refused.status_code == 422, refused.text
    assert refused.json()["type"].endswith("batch-rejected")
    assert [error["index"] for error in refused.json()["errors"]] == [1, 2, 3]
    before = await count_memories(api.runtime)
    for key in ("real1", "real2", "real3"):
        ok = await api.http.post("/v1/memories", json=_item(key), headers=alice.headers)
        assert ok.status_code == 201, ok.text
    assert await count_memories(api.runtime) == before + 3


async def test_a_batch_whose_key_is_in_flight_spends_no_embedding_call(api: Api) -> None:
    """While the first attempt under a key runs (its lock held), each retry is 409 at once: it
    spends none of the tenant's three embedding calls and writes nothing."""
    alice = await _limited(api, embedding_calls_per_minute=3)
    name = f"idem|{api.tenant_id}|{alice.principal_id}|{alice.client_id}|busy"
    headers = {**alice.headers, "Idempotency-Key": "busy"}
    body = {"items": [_item("a"), _item("b"), _item("c")]}
    before = await count_memories(api.runtime)
    async with as_owner(api.runtime) as conn:  # the first attempt, still running
        await conn.execute(text("SELECT pg_advisory_lock(hashtextextended(:n, 0))"), {"n": name})
        for _ in range(2):
            busy = await api.http.post(BATCH, json=body, headers=headers)
            assert busy.status_code == 409, busy.text
            assert busy.headers["retry-after"]
        await conn.execute(text("SELECT pg_advisory_unlock(hashtextextended(:n, 0))"), {"n": name})
    assert await count_memories(api.runtime) == before
    written = await api.http.post(BATCH, json=body, headers=headers)
    assert written.status_code == 201, written.text
    assert await count_memories(api.runtime) == before + 3


async def test_a_batch_refused_by_the_storage_quota_names_no_memory(api: Api) -> None:
    """The storage quota is checked after the batch's last insert; refused, it is rolled back,
    and its audit row names no memory, like the single write's refusal."""
    before = await count_memories(api.runtime)
    alice = await _limited(api, max_memories=before + 2)
    for key in ("s1", "s2"):
        ok = await api.http.post("/v1/memories", json=_item(key), headers=alice.headers)
        assert ok.status_code == 201, ok.text
    single = await api.http.post("/v1/memories", json=_item("s3"), headers=alice.headers)
    assert single.status_code == 429, single.text
    [*_, single_row] = await _audit_rows(api, "memory.write")
    assert (single_row["decision"], single_row["target_ids"]) == ("deny", [])

    items = [_item("b1"), _item("b2"), _item("b3")]
    refused = await api.http.post(BATCH, json={"items": items}, headers=alice.headers)
    assert refused.status_code == 429, refused.text
    assert await count_memories(api.runtime) == before + 2
    [row] = await _audit_rows(api, "memory.write_batch")
    assert (row["decision"], row["status"], row["target_ids"]) == ("deny", 429, [])
