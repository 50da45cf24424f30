"""Regressions of the red-team pass over the audit log: each test reproduces a finding that
held before its fix (truncation behind a moved head, a deleted first row, planted checkpoints,
reshaped arrays, a second pooled connection per audit row, partitions without end, a
re-pointed actor, a temporary table posing as a partition, issuer text stored verbatim)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import AsyncTestClient
from sqlalchemy import event, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from service.app import create_app
from service.audit.checkpoints import run_checkpoints
from service.audit.independent import verify_events
from service.audit.rows import known_scopes, plain_or_digest
from service.embeddings import Embedder
from service.runtime import build_runtime
from service.settings import Settings
from tests.conftest import PUBLIC_URL
from tests.fixtures.api import Api
from tests.fixtures.postgres import app_login
from tests.integration.audit.support import (
    GUARDS_OFF,
    auditor_get,
    calls_of_one_agent,
    export_events,
    owner_execute,
    run_verify_cli,
    tamper_as_owner,
    verify_report,
)


async def test_a_truncated_tail_behind_a_moved_head_is_missing_rows(
    api: Api, owner_engine: AsyncEngine, tmp_path: Path
) -> None:
    tenant = await calls_of_one_agent(api, 6)
    await run_checkpoints(api.runtime.sessionmaker, api.runtime.kek)
    checkpoint = (await auditor_get(api, "/v1/audit/checkpoints/latest")).json()
    keys = (await auditor_get(api, "/v1/audit/keys")).json()
    cut = checkpoint["seq"] - 3
    await tamper_as_owner(
        owner_engine,
        "DELETE FROM audit_events WHERE tenant_id = :t AND seq > :cut",
        "UPDATE audit_heads h SET seq = :cut, row_hash = (SELECT row_hash FROM audit_events e "
        "WHERE e.tenant_id = h.tenant_id AND e.seq = :cut) WHERE h.tenant_id = :t",
        t=tenant,
        cut=cut,
    )
    report = await verify_report(api, to_seq=cut)
    assert (report["ok"], report["first_bad_seq"], report["reason"]) == (
        False,
        cut + 1,
        "missing_row",
    )
    exported = [event for event in await export_events(api) if event["seq"] <= cut]
    verdict = verify_events(exported, {"seq": checkpoint["seq"], "hash": checkpoint["hash"]})
    assert (verdict.ok, verdict.first_bad_seq, verdict.reason) == (False, cut + 1, "missing_row")
    outcome = run_verify_cli(tmp_path, exported, checkpoint, keys)
    assert outcome.returncode == 1
    assert json.loads(outcome.stdout)["reason"] == "missing_row"


async def test_a_wiped_chain_with_checkpoints_is_missing_its_first_row(
    api: Api, owner_engine: AsyncEngine
) -> None:
    tenant = await calls_of_one_agent(api, 3)
    await run_checkpoints(api.runtime.sessionmaker, api.runtime.kek)
    await tamper_as_owner(
        owner_engine,
        "DELETE FROM audit_events WHERE tenant_id = :t",
        "DELETE FROM audit_heads WHERE tenant_id = :t",
        t=tenant,
    )
    # The verify call itself starts a new chain at 1 (the head was gone): still caught, since
    # checkpoints prove rows up to a later seq existed... and row 1 is not the row they covered.
    report = await verify_report(api)
    assert report["ok"] is False
    assert report["reason"] in {"missing_row", "checkpoint_mismatch", "chain_broken"}


async def test_a_deleted_first_row_is_found_by_both_verifiers(
    api: Api, owner_engine: AsyncEngine
) -> None:
    tenant = await calls_of_one_agent(api, 3)
    await tamper_as_owner(
        owner_engine,
        "DELETE FROM audit_events WHERE tenant_id = :t AND seq = 1",
        t=tenant,
    )
    report = await verify_report(api)
    assert (report["first_bad_seq"], report["reason"]) == (1, "missing_row")
    verdict = verify_events(await export_events(api))
    assert (verdict.first_bad_seq, verdict.reason) == (1, "missing_row")


async def test_a_planted_checkpoint_neither_silences_the_signer_nor_is_served(
    api: Api, owner_engine: AsyncEngine
) -> None:
    tenant = await calls_of_one_agent(api, 2)
    # Planted as the owner: the app role may no longer insert checkpoints directly (red-team
    # round 2, test_checkpoint_junk.py), but a row left from before must still prove nothing.
    async with owner_engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO audit_checkpoints (tenant_id, seq, row_hash, signed_at, kid, jws) "
                "VALUES (:t, 4611686018427387904, '\\x00', now(), 'forged', 'not.a.jws')"
            ),
            {"t": tenant},
        )
    assert await run_checkpoints(api.runtime.sessionmaker, api.runtime.kek) >= 1
    latest = (await auditor_get(api, "/v1/audit/checkpoints/latest")).json()
    assert latest["kid"] != "forged"
    assert latest["seq"] < 4611686018427387904
    report = await verify_report(api)
    # Unsigned, it proves nothing: reported, never a cut tail (the app cannot delete it).
    assert (report["ok"], report["reason"]) == (True, None)
    assert report["unsigned_checkpoints"] == [4611686018427387904]


async def test_reshaped_arrays_are_found_by_both_verifiers_at_the_same_row(
    api: Api, owner_engine: AsyncEngine
) -> None:
    tenant = await calls_of_one_agent(api, 6)
    await tamper_as_owner(
        owner_engine,
        "ALTER TABLE audit_events DROP CONSTRAINT ck_audit_events_flat_arrays",
        "UPDATE audit_events SET scopes = ARRAY[scopes[1:1], scopes[2:2]] "
        "WHERE tenant_id = :t AND seq = 5",
        t=tenant,
    )
    report = await verify_report(api)
    assert (report["first_bad_seq"], report["reason"]) == (5, "row_hash_mismatch")
    verdict = verify_events(await export_events(api))
    assert (verdict.first_bad_seq, verdict.reason) == (5, "row_hash_mismatch")


async def test_the_flat_array_constraint_refuses_reshaped_rows(
    api: Api, owner_engine: AsyncEngine
) -> None:
    tenant = await calls_of_one_agent(api, 1)
    with pytest.raises(DBAPIError, match="ck_audit_events_flat_arrays"):
        await owner_execute(
            owner_engine,
            GUARDS_OFF,
            "UPDATE audit_events SET target_ids = '[5:5]={00000000-0000-0000-0000-000000000000}'"
            " WHERE tenant_id = :t AND seq = 1",
            t=tenant,
        )


async def test_a_call_and_its_audit_row_hold_one_connection_at_a_time(
    settings: Settings, embedder: Embedder, api: Api
) -> None:
    """The audit row used to take a second pooled connection (for the pseudonym key and the
    actor map) while the call held its own: a burst on a cold process starved the pool and
    answered 503s after the pool timeout. Now one call never holds two connections."""
    alice = await api.new_agent("alice")
    cold = await build_runtime(
        settings, app_login(settings.database.url), embedder, owner_url=settings.database.url
    )
    held, most = 0, 0

    def checkout(*_: Any) -> None:
        nonlocal held, most
        held += 1
        most = max(most, held)

    def checkin(*_: Any) -> None:
        nonlocal held
        held -= 1

    event.listen(cold.engine.sync_engine.pool, "checkout", checkout)
    event.listen(cold.engine.sync_engine.pool, "checkin", checkin)
    try:
        async with AsyncTestClient(app=create_app(cold), base_url=PUBLIC_URL) as http:
            # A read holds its own connection only (its row goes through the group's pool); an
            # unknown path does no database work, so its row takes none of the call pool's.
            for path, connections in (("/v1/memories", 1), ("/v1/nothing", 0)):
                most = 0
                await http.get(path, headers=alice.headers)
                assert most == connections, path
    finally:
        await cold.close()


@pytest.mark.parametrize(
    "statement",
    [
        "SELECT audit_ensure_partitions(13)",
        "SELECT audit_ensure_partitions(-1)",
        "UPDATE audit_actors SET principal_id = NULL",
        "UPDATE audit_signing_keys SET retired_at = now()",
    ],
)
async def test_the_app_role_cannot_flood_partitions_or_repoint_actors(
    api: Api, statement: str
) -> None:
    await calls_of_one_agent(api, 1)
    with pytest.raises(DBAPIError, match=r"permission denied|at most 12 months"):
        async with api.runtime.engine.begin() as conn:
            await conn.execute(text(statement))


async def test_a_temporary_table_cannot_pose_as_a_partition(
    api: Api, owner_engine: AsyncEngine
) -> None:
    async with owner_engine.connect() as conn:
        month = await conn.scalar(text("SELECT to_char(now() + interval '5 months', 'YYYY_MM')"))
    name = f"audit_events_{month}"
    async with api.runtime.engine.begin() as conn:
        await conn.execute(text(f"CREATE TEMPORARY TABLE {name} (x int)"))
        await conn.execute(text("SELECT audit_ensure_partitions(6)"))
    async with owner_engine.connect() as conn:
        real = await conn.scalar(text("SELECT to_regclass(:name)"), {"name": f"public.{name}"})
    assert real is not None


def test_issuer_text_is_kept_only_when_it_looks_like_an_id() -> None:
    assert plain_or_digest("0b6c3a58-1f0e-4a8e-9e43-5f0d1c2b3a4d") == (
        "0b6c3a58-1f0e-4a8e-9e43-5f0d1c2b3a4d"
    )
    assert plain_or_digest("spiffe://acme/agent-7") == "spiffe://acme/agent-7"
    for leaky in ("bob@example.com DOB 1970-01-01", "Bearer eyJhbGciOi-leaked", "x" * 129):
        kept = plain_or_digest(leaky)
        assert kept is not None
        assert kept.startswith("sha256:")
        assert leaky not in kept
    assert known_scopes(["read:memory", "free text scope", "openid"]) == ["read:memory"]
