"""Review item 8: a tail cut off after the newest checkpoint. Checkpoints are signed every N rows
as well as every T seconds, and a caller who asks gets its own row's (seq, hash) as a receipt;
whoever holds a later head than the cut detects it, online and offline."""

from __future__ import annotations

import dataclasses
import json
import uuid
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.audit.checkpoints import run_checkpoints
from service.audit.independent import verify_events
from service.settings import AuditSettings, Settings
from tests.conftest import make_settings
from tests.fixtures.api import Agent, Api
from tests.integration.audit.support import (
    auditor_get,
    export_events,
    run_verify_cli,
    tamper_as_owner,
    verify_report,
)

EVERY_ROWS = 5


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    base = make_settings(database_url, tmp_path)
    return dataclasses.replace(
        base, audit=AuditSettings(checkpoint_seconds=0, checkpoint_rows=EVERY_ROWS)
    )


def _receipt(response: httpx.Response) -> tuple[int, str]:
    fields = dict(
        part.strip().split("=", 1) for part in response.headers["audit-receipt"].split(";")
    )
    return int(fields["seq"]), fields["hash"]


async def _stored(owner: AsyncEngine, tenant: uuid.UUID, request_id: str) -> tuple[int, str]:
    async with owner.connect() as conn:
        row = (
            await conn.execute(
                text(
                    "SELECT seq, encode(row_hash, 'hex') FROM audit_events "
                    "WHERE tenant_id = :t AND request_id = :r"
                ),
                {"t": tenant, "r": request_id},
            )
        ).one()
    return int(row[0]), str(row[1])


async def _list(api: Api, agent: Agent, **headers: str) -> httpx.Response:
    response: httpx.Response = await api.http.get(
        "/v1/memories", headers={**agent.headers, **headers}
    )
    assert response.status_code == 200, response.text
    return response


async def test_a_checkpoint_is_signed_every_n_rows(api: Api, owner_engine: AsyncEngine) -> None:
    alice = await api.new_agent("alice")
    for _ in range(12):
        await _list(api, alice)
    tenant = uuid.UUID(api.tenant_id)
    async with owner_engine.connect() as conn:
        head = await conn.scalar(
            text("SELECT seq FROM audit_heads WHERE tenant_id = :t"), {"t": tenant}
        )
        signed = (
            await conn.scalars(
                text("SELECT seq FROM audit_checkpoints WHERE tenant_id = :t ORDER BY seq"),
                {"t": tenant},
            )
        ).all()
    assert head is not None
    assert head >= 3 * EVERY_ROWS
    # No timer ran (checkpoint_seconds=0): these come from the row count alone.
    assert list(signed) == list(range(EVERY_ROWS, head + 1, EVERY_ROWS))
    latest = (await auditor_get(api, "/v1/audit/checkpoints/latest")).json()
    assert latest["seq"] == max(signed)
    report = await verify_report(api)
    assert report["ok"] is True
    assert report["checkpoint"]["signature_valid"] is True


async def test_a_receipt_is_the_callers_own_row_and_only_on_request(
    api: Api, owner_engine: AsyncEngine
) -> None:
    alice = await api.new_agent("alice")
    assert "audit-receipt" not in (await _list(api, alice)).headers
    asked = await _list(api, alice, prefer="audit-receipt")
    assert asked.headers["preference-applied"] == "audit-receipt"
    stored = await _stored(owner_engine, uuid.UUID(api.tenant_id), asked.headers["x-request-id"])
    assert _receipt(asked) == stored
    # Unauthenticated calls go to the platform chain: no receipt (it would tell anyone how many
    # calls the whole platform takes).
    anonymous = await api.http.get("/v1/memories", headers={"prefer": "audit-receipt"})
    assert anonymous.status_code == 401
    assert "audit-receipt" not in anonymous.headers


async def test_a_cut_tail_after_the_newest_checkpoint_is_found_by_a_receipt_holder(
    api: Api, owner_engine: AsyncEngine, tmp_path: Path
) -> None:
    alice = await api.new_agent("alice")
    await _list(api, alice)
    await run_checkpoints(api.runtime.sessionmaker, api.runtime.kek)
    checkpoint = (await auditor_get(api, "/v1/audit/checkpoints/latest")).json()
    keys = (await auditor_get(api, "/v1/audit/keys")).json()
    await _list(api, alice)
    held_seq, held_hash = _receipt(await _list(api, alice, prefer="audit-receipt"))
    for _ in range(2):
        await _list(api, alice)
    tenant = uuid.UUID(api.tenant_id)
    cut = held_seq - 1
    assert cut > checkpoint["seq"]  # the cut lies beyond every checkpoint the tenant holds
    await tamper_as_owner(
        owner_engine,
        "DELETE FROM audit_events WHERE tenant_id = :t AND seq > :cut",
        "ALTER TABLE audit_checkpoints DISABLE TRIGGER audit_no_mutation",
        "DELETE FROM audit_checkpoints WHERE tenant_id = :t AND seq > :cut",
        "ALTER TABLE audit_checkpoints ENABLE ALWAYS TRIGGER audit_no_mutation",
        "UPDATE audit_heads h SET seq = :cut, row_hash = (SELECT row_hash FROM audit_events e "
        "WHERE e.tenant_id = h.tenant_id AND e.seq = :cut) WHERE h.tenant_id = :t",
        t=tenant,
        cut=cut,
    )
    held = {"known_seq": held_seq, "known_hash": held_hash}
    # First, before any later call refills the numbers (verify's own row comes after it).
    report = await verify_report(api, to_seq=cut, **held)
    assert (report["ok"], report["first_bad_seq"], report["reason"]) == (
        False,
        cut + 1,
        "missing_row",
    )
    # Without the receipt the cut is invisible: that is the exposure the receipt closes.
    assert (await verify_report(api, to_seq=cut))["ok"] is True
    exported = [event for event in await export_events(api) if event["seq"] <= cut]
    verdict = verify_events(exported, known=(held_seq, held_hash))
    assert (verdict.ok, verdict.first_bad_seq, verdict.reason) == (False, cut + 1, "missing_row")
    outcome = run_verify_cli(tmp_path, exported, checkpoint, keys, head=f"{held_seq}:{held_hash}")
    assert outcome.returncode == 1, outcome.stderr
    assert json.loads(outcome.stdout)["reason"] == "missing_row"

    # New calls refill the numbers: the row at the held seq is now another row.
    for _ in range(4):
        await _list(api, alice)
    report = await verify_report(api, **held)
    assert (report["ok"], report["first_bad_seq"], report["reason"]) == (
        False,
        held_seq,
        "known_head_mismatch",
    )
    verdict = verify_events(await export_events(api), known=(held_seq, held_hash))
    assert (verdict.first_bad_seq, verdict.reason) == (held_seq, "known_head_mismatch")


async def test_a_held_head_of_an_intact_chain_verifies(api: Api, tmp_path: Path) -> None:
    alice = await api.new_agent("alice")
    held_seq, held_hash = _receipt(await _list(api, alice, prefer="audit-receipt"))
    await _list(api, alice)
    report = await verify_report(api, known_seq=held_seq, known_hash=held_hash)
    assert report["ok"] is True
    exported = await export_events(api)
    assert verify_events(exported, known=(held_seq, held_hash)).ok
    outcome = run_verify_cli(tmp_path, exported, head=f"{held_seq}:{held_hash}")
    assert outcome.returncode == 0, outcome.stdout + outcome.stderr


async def test_a_malformed_known_head_is_a_problem(api: Api) -> None:
    response = await auditor_get(api, "/v1/audit/verify", known_seq=3, known_hash="xyz")
    assert response.status_code in (400, 422)
    assert response.headers["content-type"].startswith("application/problem+json")
    assert "known_hash" in response.text
    lone = await auditor_get(api, "/v1/audit/verify", known_seq=3)
    assert lone.status_code in (400, 422)
    assert "known_hash" in lone.text
