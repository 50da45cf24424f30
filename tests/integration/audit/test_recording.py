"""Every call leaves exactly one audit row, with the right partition, decision and status."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.fixtures.api import Api
from tests.integration.audit.support import PLATFORM, audit_rows, owner_execute, rows_by_request
from tests.integration.auth.forge import claims_for, embedded_key, sign

_SEARCH = "/v1/memories/search"


class Recorder:
    """Sends each call with its own request id and remembers what its audit row must say."""

    def __init__(self, api: Api):
        self.api = api
        self.expected: dict[str, tuple[str, int, str, uuid.UUID, str]] = {}
        self.ids: list[str] = []

    async def call(
        self,
        method: str,
        path: str,
        expect: tuple[str, int, str, uuid.UUID, str],
        **kwargs: Any,
    ) -> httpx.Response:
        request_id = uuid.uuid4().hex
        headers = {"X-Request-Id": request_id, **kwargs.pop("headers", {})}
        response = await self.api.http.request(method, path, headers=headers, **kwargs)
        assert response.status_code == expect[1], (path, response.text)
        self.expected[request_id] = expect
        self.ids.append(request_id)
        return response


async def test_a_mixed_run_leaves_one_row_per_call(api: Api, owner_engine: AsyncEngine) -> None:
    alice = await api.new_agent("alice")
    reader = await api.new_agent("reader", scopes=("read:memory",))
    other = await api.other_tenant()
    bob = await other.new_agent("bob")
    bobs = await other.remember(bob, key="bob.secret", value="bob's memory")
    external = {"display_name": "dup", "external_issuer": "https://idp.example"}
    await api.new_principal(**external, external_subject="dup")
    tenant = uuid.UUID(api.tenant_id)
    form = {"grant_type": "client_credentials"}
    forged = sign(
        await embedded_key(api.runtime),
        claims_for(api.runtime, alice, api.tenant_id, iss="https://evil.example"),
    )
    before = len(await audit_rows(owner_engine))
    calls = Recorder(api)
    memory = {"subject": "service:billing", "kind": "fact", "key": "deploy", "value": "fridays"}

    # allowed
    token = ("auth.token", 200, "allow", tenant, "ok")
    await calls.call("POST", "/oauth/token", token, data=form, auth=(alice.client_id, alice.secret))
    ok_write = ("memory.write", 201, "allow", tenant, "ok")
    written = await calls.call("POST", "/v1/memories", ok_write, json=memory, headers=alice.headers)
    ok_search = ("memory.search", 200, "allow", tenant, "ok")
    # Floor off: the row counted is what the audit row must say, relevant or not.
    every = {"query": "deploy", "min_score": 0}
    await calls.call("POST", _SEARCH, ok_search, json=every, headers=alice.headers)
    await calls.call("GET", "/.well-known/jwks.json", ("auth.jwks", 200, "allow", PLATFORM, "ok"))
    # denied before anyone is authenticated: the platform partition
    bad_client = ("auth.token", 401, "deny", PLATFORM, "oauth-invalid-client")
    await calls.call("POST", "/oauth/token", bad_client, data=form, auth=(alice.client_id, "nope"))
    no_token = ("memory.list", 401, "deny", PLATFORM, "unauthenticated")
    await calls.call("GET", "/v1/memories", no_token)
    bad_iss = {"Authorization": f"Bearer {forged}"}
    await calls.call("GET", "/v1/memories", no_token, headers=bad_iss)
    await calls.call(
        "GET", "/v1/nothing", ("route.unmatched", 404, "deny", PLATFORM, "route-not-found")
    )
    not_allowed = ("route.unmatched", 405, "deny", PLATFORM, "method-not-allowed")
    await calls.call("DELETE", "/oauth/token", not_allowed)
    # denied inside the tenant
    scope = ("memory.write", 403, "deny", tenant, "insufficient-scope")
    await calls.call("POST", "/v1/memories", scope, json=memory, headers=reader.headers)
    foreign = ("memory.get", 404, "deny", tenant, "memory-not-found")
    await calls.call("GET", f"/v1/memories/{bobs['id']}", foreign, headers=alice.headers)
    taken = ("principal.create", 409, "deny", tenant, "external-subject-taken")
    duplicate = {**external, "external_subject": "dup"}
    await calls.call("POST", "/v1/principals", taken, json=duplicate, headers=api.admin.headers)
    k_big = ("memory.search", 422, "deny", tenant, "k-out-of-range")
    huge_k = {"query": "deploy", "k": 10_000}
    await calls.call("POST", _SEARCH, k_big, json=huge_k, headers=alice.headers)
    # failed: the app role loses its read privilege on memories; 500, audited on its own
    await owner_execute(owner_engine, "REVOKE SELECT ON memories FROM memgate_app")
    failed = ("memory.search", 500, "error", tenant, "internal-error")
    await calls.call("POST", _SEARCH, failed, json={"query": "deploy"}, headers=alice.headers)
    await owner_execute(owner_engine, "GRANT SELECT ON memories TO memgate_app")

    rows = await rows_by_request(owner_engine)
    assert len(await audit_rows(owner_engine)) - before == len(calls.expected)
    for request_id, expect in calls.expected.items():
        assert len(rows[request_id]) == 1, request_id
        row = rows[request_id][0]
        seen = (row["action"], row["status"], row["decision"], row["tenant_id"], row["reason"])
        assert seen == expect, row
        assert row["latency_us"] > 0
        if row["tenant_id"] == tenant:
            assert len(row["actor"]) == 64
            assert alice.principal_id not in row["actor"]
        else:
            assert row["actor"] is None
            assert row["scopes"] == []
    write_row = rows[calls.ids[1]][0]
    assert write_row["target_ids"] == [uuid.UUID(written.json()["memory"]["id"])]
    assert write_row["client_id"] == alice.client_id
    assert write_row["scopes"] == sorted(alice.scopes)
    assert write_row["token_id"]
    assert rows[calls.ids[2]][0]["result_count"] == 1
    token_row = rows[calls.ids[0]][0]
    assert token_row["client_id"] == alice.client_id
    assert token_row["token_id"]
    assert rows[calls.ids[4]][0]["client_id"] == alice.client_id  # presented, unauthenticated
    assert rows[calls.ids[6]][0]["issuer"].startswith("untrusted:")
    assert "evil" not in rows[calls.ids[6]][0]["issuer"]
    assert rows[calls.ids[10]][0]["target_ids"] == [uuid.UUID(bobs["id"])]
