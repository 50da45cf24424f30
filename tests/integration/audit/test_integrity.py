"""Review items 7 and 8: verification that NULLs cannot blind, and a cut tail that a holder of a
later head (a receipt or a checkpoint signed every N rows) detects."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.audit.checkpoints import run_checkpoints
from service.audit.independent import verify_events
from tests.fixtures.api import Api
from tests.integration.audit.support import (
    auditor_get,
    calls_of_one_agent,
    export_events,
    owner_execute,
    run_verify_cli,
    tamper_as_owner,
    verify_report,
)


async def _drop_not_null(owner: AsyncEngine, *columns: str) -> None:
    await owner_execute(
        owner, *(f"ALTER TABLE audit_events ALTER COLUMN {c} DROP NOT NULL" for c in columns)
    )


async def test_nulled_hashes_after_two_edits_fail_verify_and_still_export(
    api: Api, owner_engine: AsyncEngine, tmp_path: Path
) -> None:
    """The reviewer's case: two rows edited, the first one's row_hash and the next one's
    prev_hash set to NULL. A NULL compared with `<>` is not true, so every check passed."""
    tenant = await calls_of_one_agent(api, 6)
    await run_checkpoints(api.runtime.sessionmaker, api.runtime.kek)
    checkpoint = (await auditor_get(api, "/v1/audit/checkpoints/latest")).json()
    keys = (await auditor_get(api, "/v1/audit/keys")).json()
    await _drop_not_null(owner_engine, "row_hash", "prev_hash")
    await tamper_as_owner(
        owner_engine,
        "UPDATE audit_events SET status = 299, row_hash = NULL WHERE tenant_id = :t AND seq = 4",
        "UPDATE audit_events SET status = 298, prev_hash = NULL WHERE tenant_id = :t AND seq = 5",
        t=tenant,
    )
    report = await verify_report(api)
    assert (report["ok"], report["first_bad_seq"], report["reason"]) == (
        False,
        4,
        "row_hash_mismatch",
    )
    from_five = await verify_report(api, from_seq=5)
    assert (from_five["first_bad_seq"], from_five["reason"]) == (5, "row_hash_mismatch")
    assert (await verify_report(api, from_seq=6))["ok"] is True  # linked to row 5 as stored
    assert (await verify_report(api, to_seq=3))["ok"] is True

    # The rows are still readable and exportable as stored, so an auditor can look at them.
    page = await auditor_get(api, "/v1/audit/events", limit=200)
    assert page.status_code == 200, page.text
    stored = {item["seq"]: item for item in page.json()["items"]}
    assert (stored[4]["row_hash"], stored[5]["prev_hash"]) == (None, None)
    exported = await export_events(api)
    assert [e["seq"] for e in exported] == list(range(1, len(exported) + 1))
    assert exported[3]["row_hash"] is None
    assert exported[4]["prev_hash"] is None

    verdict = verify_events(exported)
    assert (verdict.ok, verdict.first_bad_seq, verdict.reason) == (False, 4, "row_hash_mismatch")
    outcome = run_verify_cli(tmp_path, exported, checkpoint, keys)
    assert outcome.returncode == 1, outcome.stderr
    assert "Traceback" not in outcome.stderr
    assert json.loads(outcome.stdout)["reason"] == "row_hash_mismatch"


async def test_a_null_prev_hash_alone_is_a_verdict_offline(
    api: Api, owner_engine: AsyncEngine, tmp_path: Path
) -> None:
    tenant = await calls_of_one_agent(api, 3)
    await _drop_not_null(owner_engine, "prev_hash")
    await tamper_as_owner(
        owner_engine,
        "UPDATE audit_events SET prev_hash = NULL WHERE tenant_id = :t AND seq = 2",
        t=tenant,
    )
    report = await verify_report(api)
    assert (report["ok"], report["first_bad_seq"], report["reason"]) == (
        False,
        2,
        "row_hash_mismatch",
    )
    outcome = run_verify_cli(tmp_path, await export_events(api))
    assert outcome.returncode == 1, outcome.stderr
    assert "Traceback" not in outcome.stderr
    verdict = json.loads(outcome.stdout)
    assert (verdict["first_bad_seq"], verdict["reason"]) == (2, "row_hash_mismatch")


REQUIRED = [
    "request_id",
    "delegation",
    "scopes",
    "method",
    "route",
    "action",
    "target_ids",
    "decision",
    "reason",
    "status",
    "latency_us",
]


@pytest.mark.parametrize("column", REQUIRED)
async def test_a_required_field_nulled_with_its_hash_recomputed_is_caught(
    api: Api, owner_engine: AsyncEngine, column: str
) -> None:
    """The canonical layout encodes NULL as '-', so a superuser can null a field the append
    function always fills and recompute a matching hash; such a row was never appended."""
    tenant = await calls_of_one_agent(api, 3)
    await _drop_not_null(owner_engine, column)
    async with owner_engine.connect() as conn:
        last = await conn.scalar(
            text("SELECT seq FROM audit_heads WHERE tenant_id = :t"), {"t": tenant}
        )
    # The newest row, and the head with it: the rewrite is consistent up to the end.
    await tamper_as_owner(
        owner_engine,
        f"UPDATE audit_events SET {column} = NULL WHERE tenant_id = :t AND seq = :last",
        "UPDATE audit_events e SET row_hash = sha256(prev_hash || "
        "convert_to(audit_canonical(e), 'UTF8')) WHERE tenant_id = :t AND seq = :last",
        "UPDATE audit_heads h SET row_hash = e.row_hash FROM audit_events e "
        "WHERE h.tenant_id = :t AND e.tenant_id = :t AND e.seq = :last",
        t=tenant,
        last=last,
    )
    report = await verify_report(api, to_seq=last)
    assert (report["ok"], report["first_bad_seq"], report["reason"]) == (
        False,
        last,
        "row_hash_mismatch",
    )
    exported = await export_events(api)
    assert exported[last - 1][column] is None
    verdict = verify_events(exported[:last])
    assert (verdict.ok, verdict.first_bad_seq, verdict.reason) == (
        False,
        last,
        "row_hash_mismatch",
    )


def _valid_export(events: list[dict[str, object]]) -> None:
    assert verify_events(events).ok


async def test_the_offline_verifier_judges_malformed_rows_instead_of_crashing(
    api: Api, tmp_path: Path
) -> None:
    await calls_of_one_agent(api, 2)
    exported = await export_events(api)
    _valid_export(exported)
    naive = [dict(e) for e in exported]
    naive[2]["at"] = naive[2]["at"].replace("Z", "").split("+")[0]  # no offset: not an instant
    bad_type = [dict(e) for e in exported]
    bad_type[1]["status"] = "200"  # the right text, the wrong type
    missing = [dict(e) for e in exported]
    del missing[1]["route"]
    bad_hex = [dict(e) for e in exported]
    bad_hex[2]["prev_hash"] = "zz"
    for events, seq in ((naive, 3), (bad_type, 2), (missing, 2), (bad_hex, 3)):
        verdict = verify_events(events)
        assert (verdict.ok, verdict.first_bad_seq, verdict.reason) == (
            False,
            seq,
            "row_hash_mismatch",
        )
        outcome = run_verify_cli(tmp_path, events)
        assert outcome.returncode == 1, outcome.stderr
        assert "Traceback" not in outcome.stderr
        assert json.loads(outcome.stdout)["first_bad_seq"] == seq
    outcome = run_verify_cli(tmp_path, [{"seq": "one"}])
    assert outcome.returncode == 1, outcome.stderr
    assert "Traceback" not in outcome.stderr
    assert json.loads(outcome.stdout)["ok"] is False


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE audit_heads SET seq = NULL WHERE tenant_id = :t",
        "UPDATE audit_heads SET row_hash = NULL WHERE tenant_id = :t",
        "DELETE FROM audit_heads WHERE tenant_id = :t",
    ],
)
async def test_a_nulled_or_deleted_head_is_a_head_mismatch(
    api: Api, owner_engine: AsyncEngine, statement: str
) -> None:
    """A head that names no row used to read as an empty chain: `ok: true`, nothing checked."""
    tenant = await calls_of_one_agent(api, 3)
    await owner_execute(
        owner_engine,
        "ALTER TABLE audit_heads ALTER COLUMN seq DROP NOT NULL",
        "ALTER TABLE audit_heads ALTER COLUMN row_hash DROP NOT NULL",
    )
    async with owner_engine.connect() as conn:
        top = await conn.scalar(
            text("SELECT max(seq) FROM audit_events WHERE tenant_id = :t"), {"t": tenant}
        )
    await owner_execute(owner_engine, statement, t=tenant)
    report = await verify_report(api)
    assert (report["ok"], report["first_bad_seq"], report["reason"]) == (
        False,
        top,
        "head_mismatch",
    )
    assert report["checked"] == top
