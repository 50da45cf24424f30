"""Token-request, embedding-call and storage limits, the `Limits` schema's checks, and the
limits' own row-level security; MCP is limited like REST."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import msgspec
import pytest
from sqlalchemy import text

from service.db.tenancy import name_tenant
from service.problems import InvalidRequest
from service.quotas.schemas import Limits
from service.quotas.service import limits_of, set_limits, usage_of
from tests.fixtures.api import Api
from tests.integration.quotas.support import assert_limited, audit_of, limit, stored


def note(key: str, value: str = "Tuesday") -> dict[str, Any]:
    """A distinct fact of the subject per key (`new_key`: past the write gate)."""
    return {
        "subject": "service:billing",
        "kind": "fact",
        "key": key,
        "value": value,
        "new_key": True,
    }


def stored_bytes(key: str, value: str = "Tuesday") -> int:
    """What a `note` row stores: subject, key, value and its (empty) metadata, as UTF-8."""
    return len(b"service:billing") + len(key.encode()) + len(value.encode()) + len("{}")


async def test_token_requests_are_limited_per_client_and_per_tenant(api: Api) -> None:
    alice = await api.new_agent("alice")
    carol = await api.new_agent("carol")
    await limit(
        api.runtime, api.tenant_id, alice.client_id, token_requests_per_second=0.001, token_burst=2
    )
    first = [await api.token_response(alice.client_id, alice.secret) for _ in range(2)]
    assert [r.status_code for r in first] == [200, 200]
    refused = await api.token_response(alice.client_id, alice.secret)
    assert_limited(refused, "client-token-requests", 2)
    assert "access_token" not in refused.json()
    assert refused.headers["cache-control"] == "no-store"
    # Another client of the tenant still gets tokens; then a tenant limit covers both.
    assert (await api.token_response(carol.client_id, carol.secret)).status_code == 200
    await limit(api.runtime, api.tenant_id, token_requests_per_second=0.001, token_burst=1)
    assert (await api.token_response(carol.client_id, carol.secret)).status_code == 200
    assert_limited(
        await api.token_response(carol.client_id, carol.secret), "tenant-token-requests", 1
    )
    async with api.runtime.sessionmaker() as session:
        audited = await session.execute(
            text(
                "SELECT reason, client_id FROM audit_events WHERE route = '/oauth/token'"
                " AND status = 429 ORDER BY seq"
            )
        )
        rows = audited.all()
    # Token refusals go to the platform chain, like every token request nobody was issued.
    assert [tuple(r) for r in rows] == [
        ("rate-limited", alice.client_id),
        ("rate-limited", carol.client_id),
    ]


async def test_the_token_bucket_refills_after_its_window(api: Api) -> None:
    alice = await api.new_agent("alice")
    await limit(
        api.runtime, api.tenant_id, alice.client_id, token_requests_per_second=0.5, token_burst=1
    )
    assert (await api.token_response(alice.client_id, alice.secret)).status_code == 200
    # A token request costs an argon2 verification: 2 s per token leaves room on a slow host.
    refused = await api.token_response(alice.client_id, alice.secret)
    assert_limited(refused, "client-token-requests", 1)
    assert refused.headers["ratelimit-policy"] == '"client-token-requests";q=1;w=2'
    await asyncio.sleep(2.1)  # one token at 0.5/s
    assert (await api.token_response(alice.client_id, alice.secret)).status_code == 200


async def test_embedding_calls_per_minute_bite_and_nothing_is_written(api: Api) -> None:
    alice = await api.new_agent("alice")
    await limit(api.runtime, api.tenant_id, embedding_calls_per_minute=2)
    assert (
        await api.http.post("/v1/memories", json=note("a"), headers=alice.headers)
    ).status_code == 201
    assert (await api.search(alice, "when is the deploy window")).status_code == 200
    refused = await api.http.post("/v1/memories", json=note("b"), headers=alice.headers)
    body = assert_limited(refused, "tenant-embeddings", 2)
    assert refused.headers["ratelimit-policy"] == '"tenant-embeddings";q=2;w=60'
    assert "2 embedding calls per minute" in body["detail"]
    assert await stored(api.runtime, api.tenant_id) == 1
    audited = await audit_of(api.runtime, api.tenant_id, 429)
    assert [(r["action"], r["reason"]) for r in audited] == [("memory.write", "rate-limited")]
    # A request that embeds nothing is not an embedding call.
    assert (await api.http.get("/v1/memories", headers=alice.headers)).status_code == 200


async def test_stored_memories_quota_refuses_the_write_and_writes_nothing(api: Api) -> None:
    alice = await api.new_agent("alice")
    await limit(api.runtime, api.tenant_id, max_memories=2)
    for key in ("a", "b"):
        assert (
            await api.http.post("/v1/memories", json=note(key), headers=alice.headers)
        ).status_code == 201
    refused = await api.http.post("/v1/memories", json=note("c"), headers=alice.headers)
    body = assert_limited(refused, "tenant-memories", 2)
    assert body["type"].endswith("/quota-exceeded")
    assert "would make 3" in body["detail"]
    assert await stored(api.runtime, api.tenant_id) == 2
    audited = await audit_of(api.runtime, api.tenant_id, 429)
    assert [(r["action"], r["reason"], r["decision"]) for r in audited] == [
        ("memory.write", "quota-exceeded", "deny")
    ]
    listed = (await api.http.get("/v1/memories", headers=alice.headers)).json()["items"]
    assert sorted(m["key"] for m in listed) == ["a", "b"]
    # A new version of a key is storage too (red-team finding: counting live rows only let a
    # tenant at its cap write one key again and again): refused, nothing written.
    again = await api.http.post("/v1/memories", json=note("a", "Wednesday"), headers=alice.headers)
    assert_limited(again, "tenant-memories", 2)
    assert await stored(api.runtime, api.tenant_id) == 2
    # Forgetting one makes room again.
    first = next(m for m in listed if m["key"] == "a")
    gone = await api.http.delete(f"/v1/memories/{first['id']}", headers=alice.headers)
    assert gone.status_code == 204
    assert (
        await api.http.post("/v1/memories", json=note("c"), headers=alice.headers)
    ).status_code == 201
    async with api.runtime.sessionmaker.begin() as session:
        assert await usage_of(session, uuid.UUID(api.tenant_id)) == (
            2,
            stored_bytes("b") + stored_bytes("c"),
        )


async def test_stored_bytes_quota_counts_utf8_bytes_of_what_is_stored(api: Api) -> None:
    alice = await api.new_agent("alice")
    other = await api.other_tenant()
    bob = await other.new_agent("bob")
    cap = stored_bytes("a", "ééé")  # "é" is two bytes
    await limit(api.runtime, api.tenant_id, max_bytes=cap)
    assert (
        await api.http.post("/v1/memories", json=note("a", "ééé"), headers=alice.headers)
    ).status_code == 201
    refused = await api.http.post("/v1/memories", json=note("b", "x"), headers=alice.headers)
    body = assert_limited(refused, "tenant-bytes", cap)
    assert f"would make {cap + stored_bytes('b', 'x')}" in body["detail"]
    assert await stored(api.runtime, api.tenant_id) == 1
    # Metadata is stored too (red-team finding: a one-letter value with 15 KB of metadata
    # passed a bytes quota).
    async with api.runtime.sessionmaker.begin() as session:
        await set_limits(session, uuid.UUID(api.tenant_id), Limits(max_bytes=cap + 100))
    api.runtime.quotas.forget(uuid.UUID(api.tenant_id))
    padded = note("b", "x") | {"metadata": {"pad": "y" * 200}}
    heavy = await api.http.post("/v1/memories", json=padded, headers=alice.headers)
    assert_limited(heavy, "tenant-bytes", cap + 100)
    # The neighbour's storage is its own.
    big = note("b", "x" * 100)
    assert (await other.http.post("/v1/memories", json=big, headers=bob.headers)).status_code == 201


async def test_limits_are_validated_and_a_bad_set_changes_nothing(api: Api) -> None:
    tenant = uuid.UUID(api.tenant_id)
    with pytest.raises(msgspec.ValidationError, match="unknown field"):
        msgspec.json.decode(b'{"requests_per_secnd": 5}', type=Limits)
    with pytest.raises(msgspec.ValidationError, match="requests_per_second"):
        msgspec.json.decode(b'{"requests_per_second": 0}', type=Limits)
    with pytest.raises(msgspec.ValidationError, match="concurrent_requests"):
        msgspec.json.decode(b'{"concurrent_requests": 100001}', type=Limits)
    async with api.runtime.sessionmaker.begin() as session:
        with pytest.raises(InvalidRequest) as burst:
            await set_limits(session, tenant, Limits(request_burst=5))
        with pytest.raises(InvalidRequest) as client_storage:
            await set_limits(session, tenant, Limits(max_memories=5), api.admin.client_id)
        assert await limits_of(session, tenant) == Limits()
    assert burst.value.extensions["errors"] == [
        {"field": "request_burst", "message": "needs requests_per_second"}
    ]
    assert client_storage.value.extensions["errors"][0]["field"] == "max_memories"
    async with api.runtime.sessionmaker.begin() as session:
        await set_limits(session, tenant, Limits(requests_per_second=2.5, max_memories=7))
        assert await limits_of(session, tenant) == Limits(requests_per_second=2.5, max_memories=7)
        await set_limits(session, tenant, Limits())  # empty: removed
        assert await limits_of(session, tenant) == Limits()


async def test_the_limit_rows_are_the_tenants_own_under_row_level_security(api: Api) -> None:
    other = await api.other_tenant()
    await limit(api.runtime, api.tenant_id, requests_per_second=1)
    await limit(api.runtime, other.tenant_id, requests_per_second=2)
    async with api.runtime.sessionmaker.begin() as session:
        await name_tenant(session, uuid.UUID(other.tenant_id))
        seen = (await session.execute(text("SELECT tenant_id FROM tenant_limits"))).all()
        # set_limits names the tenant it writes for, then the transaction's tenant again.
        await set_limits(session, uuid.UUID(api.tenant_id), Limits(requests_per_second=3))
        after = (await session.execute(text("SELECT tenant_id FROM tenant_limits"))).all()
    assert [str(r[0]) for r in seen] == [other.tenant_id]
    assert [str(r[0]) for r in after] == [other.tenant_id]


async def test_mcp_is_limited_like_rest(api: Api) -> None:
    alice = await api.new_agent("alice")
    await limit(api.runtime, api.tenant_id, requests_per_second=0.001, request_burst=1)
    accept = {"accept": "application/json, text/event-stream"} | alice.headers
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    assert (await api.http.post("/mcp", json=ping, headers=accept)).status_code == 200
    assert_limited(await api.http.post("/mcp", json=ping, headers=accept), "tenant-requests", 1)
