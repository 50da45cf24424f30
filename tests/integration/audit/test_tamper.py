"""Tamper evidence: the app role cannot rewrite the log, triggers stop casual edits, and what a
superuser does anyway is found by verify (and by the independent verifier) at the right row."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from litestar.testing import AsyncTestClient
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from service.app import create_app
from service.audit.checkpoints import run_checkpoints
from service.audit.independent import verify_events
from service.embeddings import Embedder
from service.runtime import build_runtime
from service.settings import Settings
from tests.conftest import PUBLIC_URL
from tests.fixtures.api import Api
from tests.integration.audit.support import (
    auditor_get,
    export_events,
    owner_execute,
    run_verify_cli,
    tamper_as_owner,
    verify_report,
)

ROWS = 8


async def _chain(api: Api) -> uuid.UUID:
    """A tenant whose chain has at least ROWS rows (bootstrap, agent setup and some reads)."""
    alice = await api.new_agent("alice")
    for n in range(3):
        await api.remember(alice, key=f"k.{n}", value=f"value {n}")
    await api.http.get("/v1/memories", headers=alice.headers)
    return uuid.UUID(api.tenant_id)


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE audit_events SET status = 200",
        "DELETE FROM audit_events",
        "TRUNCATE audit_events",
        "INSERT INTO audit_events SELECT * FROM audit_events",
        "UPDATE audit_heads SET seq = 1",
        "DELETE FROM audit_checkpoints",
        "SELECT audit_ensure_partition(now() + interval '5 years')",
    ],
)
async def test_the_app_role_cannot_rewrite_the_log(api: Api, statement: str) -> None:
    await _chain(api)
    with pytest.raises(DBAPIError, match="permission denied"):
        async with api.runtime.engine.begin() as conn:
            await conn.execute(text(statement))


async def test_the_app_role_owns_nothing_and_bypasses_nothing(api: Api) -> None:
    async with api.runtime.engine.connect() as conn:
        role = (
            await conn.execute(
                text(
                    "SELECT current_user, rolsuper, rolbypassrls, rolcreaterole FROM pg_roles "
                    "WHERE rolname = current_user"
                )
            )
        ).one()
        owned = await conn.scalar(
            text(
                "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = 'public' AND pg_get_userbyid(c.relowner) = current_user"
            )
        )
    assert tuple(role) == ("memgate_app", False, False, False)
    assert owned == 0


@pytest.mark.parametrize(
    "statement",
    [
        "DELETE FROM audit_events",
        "ALTER TABLE audit_events DISABLE TRIGGER audit_no_mutation",
        "DELETE FROM audit_heads",
        "SET ROLE postgres",
    ],
)
async def test_leaving_the_app_role_gains_nothing(api: Api, statement: str) -> None:
    """The app logs in as a member of memgate_app, not as the owner: RESET ROLE lands on a
    login with the same privileges (red-team finding: it used to land on the superuser)."""
    await _chain(api)
    async with api.runtime.engine.connect() as conn:
        await conn.execute(text("RESET ROLE"))
        who = (await conn.execute(text("SELECT session_user, current_user"))).one()
        assert tuple(who) == ("memgate_api", "memgate_api")
        with pytest.raises(DBAPIError, match=r"permission denied|must be owner"):
            await conn.execute(text(statement))
    assert api.runtime.login_problems == []


async def test_an_owner_login_is_reported_and_readyz_fails(
    settings: Settings, embedder: Embedder
) -> None:
    owner_runtime = await build_runtime(
        settings, settings.database.url, embedder, owner_url=settings.database.url
    )
    try:
        assert "the database login is a superuser" in owner_runtime.login_problems
        async with AsyncTestClient(app=create_app(owner_runtime), base_url=PUBLIC_URL) as http:
            ready = await http.get("/readyz")
        assert ready.status_code == 503
        assert ready.json() == {"status": "not ready"}  # the reason is logged
    finally:
        await owner_runtime.close()


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE audit_events SET status = 200",
        "DELETE FROM audit_events",
        "TRUNCATE audit_events",
        "UPDATE audit_checkpoints SET seq = 1",
    ],
)
async def test_triggers_refuse_even_the_owner_and_replica_mode(
    api: Api, owner_engine: AsyncEngine, statement: str
) -> None:
    await _chain(api)
    await run_checkpoints(api.runtime.sessionmaker, api.runtime.kek)
    for preamble in ("SELECT 1", "SET LOCAL session_replication_role = replica"):
        with pytest.raises(DBAPIError, match="append-only"):
            await owner_execute(owner_engine, preamble, statement)
    async with owner_engine.connect() as conn:
        partition = await conn.scalar(
            text("SELECT min(c.relname) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid")
        )
    with pytest.raises(DBAPIError, match="append-only"):
        await owner_execute(owner_engine, f"TRUNCATE {partition}")


async def test_an_untouched_chain_verifies_against_its_checkpoint(api: Api, tmp_path: Path) -> None:
    tenant = await _chain(api)
    assert await run_checkpoints(api.runtime.sessionmaker, api.runtime.kek) >= 1
    checkpoint = (await auditor_get(api, "/v1/audit/checkpoints/latest")).json()
    report = await verify_report(api)
    assert report["ok"] is True
    assert report["first_bad_seq"] is None
    assert report["checked"] == report["head_seq"] >= ROWS
    assert report["checkpoint"]["seq"] == checkpoint["seq"]
    assert report["checkpoint"]["signature_valid"] is True
    assert report["checkpoint"]["matches_chain"] is True
    assert checkpoint["tenant_id"] == str(tenant)

    exported = await export_events(api)
    assert [event["seq"] for event in exported] == list(range(1, len(exported) + 1))
    verdict = verify_events(exported, {"seq": checkpoint["seq"], "hash": checkpoint["hash"]})
    assert verdict.ok
    assert verdict.checkpoint_confirmed is True
    # The command itself, on files, as an auditor would run it.
    keys = (await auditor_get(api, "/v1/audit/keys")).json()
    outcome = run_verify_cli(tmp_path, exported, checkpoint, keys)
    assert outcome.returncode == 0, outcome.stdout + outcome.stderr
    assert json.loads(outcome.stdout)["ok"] is True


TAMPERING = {
    "altered": (
        "UPDATE audit_events SET status = 299 WHERE tenant_id = :tenant AND seq = :seq",
        "row_hash_mismatch",
    ),
    "altered_scopes": (
        "UPDATE audit_events SET scopes = '{manage:tenant}' "
        "WHERE tenant_id = :tenant AND seq = :seq",
        "row_hash_mismatch",
    ),
    "deleted": (
        "DELETE FROM audit_events WHERE tenant_id = :tenant AND seq = :seq",
        "missing_row",
    ),
    "inserted": (
        "INSERT INTO audit_events SELECT tenant_id, seq, at + interval '1 microsecond', "
        "request_id, trace_id, actor, client_id, delegation, token_id, issuer, scopes, method, "
        "route, 'memory.delete', target_ids, result_count, decision, reason, status, latency_us, "
        "policy_version, prev_hash, row_hash FROM audit_events "
        "WHERE tenant_id = :tenant AND seq = :seq",
        "duplicate_seq",
    ),
}


@pytest.mark.parametrize("kind", sorted(TAMPERING))
async def test_verify_names_the_first_tampered_row(
    api: Api, owner_engine: AsyncEngine, kind: str
) -> None:
    tenant = await _chain(api)
    statement, reason = TAMPERING[kind]
    seq = 5
    await tamper_as_owner(owner_engine, statement, tenant=tenant, seq=seq)
    report = await verify_report(api)
    assert report["ok"] is False
    assert (report["first_bad_seq"], report["reason"]) == (seq, reason)
    # A range that ends before the damage still verifies; one that starts after it does too
    # (each row is chained to its stored predecessor).
    assert (await verify_report(api, to_seq=seq - 1))["ok"] is True
    verdict = verify_events(await export_events(api))
    assert (verdict.first_bad_seq, verdict.reason) == (seq, reason)


CHANGED = {
    "at": "at + interval '1 microsecond'",
    "request_id": "request_id || 'x'",
    "trace_id": "coalesce(trace_id, '') || 'x'",
    "actor": "coalesce(actor, '') || 'x'",
    "client_id": "coalesce(client_id, '') || 'x'",
    "delegation": "array_append(delegation, 'user:x')",
    "token_id": "coalesce(token_id, '') || 'x'",
    "issuer": "coalesce(issuer, '') || 'x'",
    "scopes": "array_append(scopes, 'manage:tenant')",
    "method": "method || 'x'",
    "route": "route || 'x'",
    "action": "action || 'x'",
    "target_ids": "array_append(target_ids, gen_random_uuid())",
    "result_count": "coalesce(result_count, 0) + 1",
    "decision": "decision || 'x'",
    "reason": "reason || 'x'",
    "status": "status + 1",
    "latency_us": "latency_us + 1",
    "policy_version": "coalesce(policy_version, 0) + 1",
}
"""Every column the row hash covers (audit_canonical), and a change to it."""


@pytest.mark.parametrize("column", sorted(CHANGED))
async def test_a_change_to_any_column_of_the_first_a_middle_or_the_last_row_is_found(
    api: Api, owner_engine: AsyncEngine, column: str
) -> None:
    """Issue 18: any one column, at either end of the chain or inside it. Each range starts
    after the damage before it, so each change is found on its own (a row is chained to its
    stored predecessor)."""
    tenant = await _chain(api)
    last = int((await verify_report(api))["to_seq"])
    middle = last // 2
    for seq in (1, middle, last):
        await tamper_as_owner(
            owner_engine,
            f"UPDATE audit_events SET {column} = {CHANGED[column]} "
            "WHERE tenant_id = :tenant AND seq = :seq",
            tenant=tenant,
            seq=seq,
        )
    for from_seq, bad in ((1, 1), (2, middle), (middle + 1, last)):
        report = await verify_report(api, from_seq=from_seq, to_seq=last)
        assert (report["ok"], report["first_bad_seq"]) == (False, bad), (column, report)
        assert report["reason"] == "row_hash_mismatch"


async def test_a_consistent_rewrite_is_caught_by_the_checkpoint(
    api: Api, owner_engine: AsyncEngine, tmp_path: Path
) -> None:
    """A superuser who alters a row and recomputes every later hash gets a chain that is
    internally valid; the signed checkpoint the tenant already holds no longer matches it."""
    tenant = await _chain(api)
    await run_checkpoints(api.runtime.sessionmaker, api.runtime.kek)
    checkpoint = (await auditor_get(api, "/v1/audit/checkpoints/latest")).json()
    keys = (await auditor_get(api, "/v1/audit/keys")).json()
    await tamper_as_owner(
        owner_engine,
        "UPDATE audit_events SET status = 299 WHERE tenant_id = :tenant AND seq = 3",
        """
        DO $$
        DECLARE r record; prev bytea;
        BEGIN
          FOR r IN SELECT * FROM audit_events WHERE tenant_id = '{tenant}' AND seq >= 3
                   ORDER BY seq LOOP
            SELECT row_hash INTO prev FROM audit_events
             WHERE tenant_id = r.tenant_id AND seq = r.seq - 1;
            UPDATE audit_events e SET prev_hash = prev,
                   row_hash = sha256(prev || convert_to(audit_canonical(e), 'UTF8'))
             WHERE e.tenant_id = r.tenant_id AND e.seq = r.seq;
          END LOOP;
        END $$
        """.replace("{tenant}", str(tenant)),
        "UPDATE audit_heads h SET row_hash = (SELECT e.row_hash FROM audit_events e "
        "WHERE e.tenant_id = h.tenant_id AND e.seq = h.seq) WHERE h.tenant_id = :tenant",
        tenant=tenant,
    )
    report = await verify_report(api, to_seq=checkpoint["seq"])
    assert report["ok"] is False
    assert report["reason"] == "checkpoint_mismatch"
    assert report["first_bad_seq"] == checkpoint["seq"]
    assert report["checkpoint"]["signature_valid"] is True
    assert report["checkpoint"]["matches_chain"] is False

    exported = await export_events(api)
    assert verify_events(exported).ok  # internally consistent...
    outcome = run_verify_cli(tmp_path, exported, checkpoint, keys)
    assert outcome.returncode == 1
    assert json.loads(outcome.stdout)["reason"] == "checkpoint_mismatch"  # ...but not the past
