"""Deleting a tenant is an erasure of the whole tenant: one transaction, a signed receipt, a
proof (rows left per table, VACUUM, the files' byte scan before and after), and the audit chain
kept content-free (the default) or dropped."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from service.audit.checkpoints import verify_signature
from tests.fixtures.api import Api
from tests.integration.erasure.support import assert_no_canary
from tests.integration.memory.support import as_owner, assert_problem, scalar
from tests.integration.tenants.support import platform

CANARY = "zq7-canary-tenant the whole tenant's secret plan"
KEPT_CHAIN = {"audit_events", "audit_heads", "audit_checkpoints"}


async def _full_tenant(api: Api) -> Api:
    """A tenant with a memory, a revoked one (its reason), a stored idempotent answer and a
    job run: rows in the tables the deletion used to leave behind."""
    tenant = await api.other_tenant("doomed")
    agent = await tenant.new_agent("alice")
    await tenant.remember(agent, key="plan", value=CANARY)
    revoked = await tenant.remember(agent, key="old", value="zq7-canary-revoked an old claim")
    done = await tenant.http.post(
        f"/v1/memories/{revoked['id']}/revoke",
        json={"reason": "superseded by policy"},
        headers=agent.headers,
    )
    assert done.status_code == 200, done.text
    batch = await tenant.http.post(
        "/v1/memories:batch",
        json={
            "items": [
                {"subject": "service:x", "kind": "fact", "key": "b", "value": "zq7-canary-batch"}
            ]
        },
        headers={**agent.headers, "Idempotency-Key": "k-1"},
    )
    assert batch.status_code in (200, 201, 207), batch.text
    run = await tenant.http.post(
        "/v1/jobs/memory.sweep_expired/runs", json={"dry_run": True}, headers=tenant.admin.headers
    )
    assert run.status_code == 202, run.text
    return tenant


async def _delete(admin: Api, tenant_id: str, **params: str) -> httpx.Response:
    path = f"/v1/tenants/{tenant_id}"
    await admin.http.post(f"{path}/disable", headers=admin.admin.headers)
    plan = (await admin.http.delete(path, headers=admin.admin.headers)).json()
    return await admin.http.delete(
        path, params={"confirm": plan["confirm"], **params}, headers=admin.admin.headers
    )


async def _rows_of(api: Api, table: str, tenant_id: str) -> int:
    count: int = await scalar(
        api.runtime, f"SELECT count(*) FROM {table} WHERE tenant_id = :t", t=tenant_id
    )
    return count


async def test_a_deleted_tenant_is_erased_with_receipt_and_proof(api: Api) -> None:
    admin = await platform(api)
    tenant = await _full_tenant(api)
    assert await _rows_of(api, "revocations", tenant.tenant_id) == 1
    assert await _rows_of(api, "idempotency_keys", tenant.tenant_id) == 1

    done = await _delete(admin, tenant.tenant_id)
    assert done.status_code == 200, done.text
    answer: dict[str, Any] = done.json()
    assert answer["deleted"] is True
    keys = await admin.http.get("/v1/audit/keys", headers=admin.admin.headers)
    claims = verify_signature(answer["receipt"], keys.json())
    assert claims is not None
    assert claims["erased_tenant"] == tenant.tenant_id
    assert claims["erasure"] == answer["erasure_id"]
    assert claims["audit_chain"] == "kept"
    assert claims["counts"]["memories"] == 3
    assert claims["counts"]["revocations"] == 1
    assert claims["counts"]["idempotency_keys"] == 1
    assert claims["counts"]["pseudonym_keys"] == 1
    assert_no_canary(done.text, "the deletion's answer")

    proof = await admin.http.get(
        f"/v1/tenants/{tenant.tenant_id}/proof", headers=admin.admin.headers
    )
    assert proof.status_code == 200, proof.text
    body = proof.json()
    assert body["erasure_id"] == answer["erasure_id"]
    assert set(body["rows_left"]) <= KEPT_CHAIN, body["rows_left"]
    facts = body["evidence"]
    assert facts["finalized"] is True
    values = facts["needles"]["values"]
    assert values == 3
    assert all(found > 0 for found in facts["files_before"]["found"])
    assert facts["files_after"]["found"] == [0] * values
    assert all(state == "ok" for state in facts["vacuum"]["tables"].values())
    # The tables the deletion used to leave behind (red-team class: a revocation's reason and a
    # stored answer outlived their tenant), and the chain's actor map and pseudonym key.
    for table in ("revocations", "memory_hidings", "idempotency_keys", "job_runs"):
        assert await _rows_of(api, table, tenant.tenant_id) == 0, table
    for table in ("audit_actors", "audit_pseudonym_keys"):
        assert await _rows_of(api, table, tenant.tenant_id) == 0, table
    assert await _rows_of(api, "audit_events", tenant.tenant_id) > 0  # kept, content-free
    async with as_owner(api.runtime) as conn:
        rows = await conn.execute(
            text("SELECT row_to_json(a)::text FROM audit_events a WHERE tenant_id = :t"),
            {"t": tenant.tenant_id},
        )
        assert_no_canary("\n".join(row[0] for row in rows), "the kept audit chain")


async def test_dropping_the_audit_chain_leaves_only_the_retired_row(api: Api) -> None:
    admin = await platform(api)
    tenant = await _full_tenant(api)
    done = await _delete(admin, tenant.tenant_id, audit="drop")
    assert done.status_code == 200, done.text
    claims = verify_signature(
        done.json()["receipt"],
        (await admin.http.get("/v1/audit/keys", headers=admin.admin.headers)).json(),
    )
    assert claims is not None
    assert claims["audit_chain"] == "dropped"
    assert claims["counts"]["audit_rows"] > 0
    proof = await admin.http.get(
        f"/v1/tenants/{tenant.tenant_id}/proof", headers=admin.admin.headers
    )
    assert proof.json()["rows_left"] == {}
    for table in KEPT_CHAIN:
        assert await _rows_of(api, table, tenant.tenant_id) == 0, table
    # The deletion itself is in the platform chain.
    recorded = await scalar(
        api.runtime,
        "SELECT count(*) FROM audit_events WHERE tenant_id = :p AND action = 'tenant.delete' "
        "AND :t = ANY (target_ids) AND decision = 'allow'",
        p=admin.tenant_id,
        t=tenant.tenant_id,
    )
    assert recorded >= 1


async def test_audit_rows_stay_append_only_for_a_live_tenant(api: Api) -> None:
    """The one way out of the audit guard (a retired tenant's chain, deleted by the table
    owner naming it) does not open for a live tenant, even with the setting forged."""
    async with as_owner(api.runtime) as conn:
        await conn.execute(
            text("SELECT set_config('memgate.audit_drop_tenant', :t, true)"), {"t": api.tenant_id}
        )
        with pytest.raises(DBAPIError, match="append-only"):
            await conn.execute(
                text("DELETE FROM audit_events WHERE tenant_id = :t"), {"t": api.tenant_id}
            )
    assert await _rows_of(api, "audit_events", api.tenant_id) > 0


async def test_the_proof_of_an_unknown_tenant_is_404(api: Api) -> None:
    admin = await platform(api)
    response = await admin.http.get(
        f"/v1/tenants/{uuid.uuid4()}/proof", headers=admin.admin.headers
    )
    assert_problem(response, 404, "tenant-not-found")
