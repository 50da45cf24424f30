"""Red-team round 2 (F1, F2): junk checkpoint rows. A stolen app login that named the victim
tenant could insert checkpoints at any seq: 20 of them past the head made `latest` answer 404
for ever, rows planted ahead of the head took the seqs the signers needed, and a million made
every verify spend ~30 s of CPU checking signatures."""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path
from typing import Any

import pytest
import structlog
from joserfc.jwk import KeySet
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

import service.audit.service as audit_service
import service.audit.verify as audit_verify
from service.audit.checkpoints import run_checkpoints, verify_signature
from service.settings import AuditSettings, Settings
from tests.conftest import make_settings
from tests.fixtures.api import Api
from tests.integration.audit.support import (
    auditor_get,
    calls_of_one_agent,
    owner_execute,
    verify_report,
)

# Junk the way the red team planted it (here as the owner, who still may: rows planted before
# the fix, or the login's own INSERT that the fix takes away).
PLANT_JUNK = (
    "INSERT INTO audit_checkpoints (tenant_id, seq, row_hash, signed_at, kid, jws) "
    "SELECT :t, g, '\\x00', now(), :kid, 'junk' "
    "FROM generate_series(CAST(:low AS bigint), CAST(:high AS bigint)) g"
)
CALL_INSERT = "SELECT audit_checkpoint_insert(:t, :seq, :hash, now(), :kid, 'junk')"


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    # No row-N checkpoints: the timed signer (run by hand here) makes every checkpoint.
    base = make_settings(database_url, tmp_path)
    return dataclasses.replace(base, audit=AuditSettings(checkpoint_seconds=0, checkpoint_rows=0))


async def _head(owner: AsyncEngine, tenant: uuid.UUID) -> tuple[int, bytes]:
    async with owner.connect() as conn:
        seq, row_hash = (
            await conn.execute(
                text("SELECT seq, row_hash FROM audit_heads WHERE tenant_id = :t"), {"t": tenant}
            )
        ).one()
        return int(seq), bytes(row_hash)


async def _kid(owner: AsyncEngine) -> str:
    async with owner.connect() as conn:
        return str(await conn.scalar(text("SELECT kid FROM audit_signing_keys LIMIT 1")))


async def _count(owner: AsyncEngine, tenant: uuid.UUID) -> int:
    async with owner.connect() as conn:
        query = text("SELECT count(*) FROM audit_checkpoints WHERE tenant_id = :t")
        return int(await conn.scalar(query, {"t": tenant}) or 0)


async def test_the_app_login_cannot_plant_checkpoints_even_for_the_tenant_it_names(
    api: Api, owner_engine: AsyncEngine
) -> None:
    tenant = await calls_of_one_agent(api, 3)
    head_seq, head_hash = await _head(owner_engine, tenant)
    kid = await _kid(owner_engine)
    before = await _count(owner_engine, tenant)
    attempts: list[tuple[str, dict[str, Any], str]] = [
        (  # the red team's statement: a direct INSERT past the head
            PLANT_JUNK,
            {"t": tenant, "kid": "x", "low": 10**12, "high": 10**12 + 19},
            "42501",
        ),
        (CALL_INSERT, {"t": tenant, "seq": head_seq + 1, "hash": head_hash, "kid": kid}, "22023"),
        (CALL_INSERT, {"t": tenant, "seq": head_seq, "hash": b"\x00", "kid": kid}, "22023"),
        (CALL_INSERT, {"t": tenant, "seq": head_seq, "hash": head_hash, "kid": "x"}, "22023"),
    ]
    for statement, params, sqlstate in attempts:
        async with api.runtime.engine.begin() as conn:  # the app's login, naming the tenant
            await conn.execute(
                text("SELECT set_config('memgate.tenant_id', :t, true)"), {"t": str(tenant)}
            )
            with pytest.raises(DBAPIError) as refused:
                await conn.execute(text(statement), params)
            assert getattr(refused.value.orig, "sqlstate", None) == sqlstate, params
    assert await _count(owner_engine, tenant) == before
    # The signer, through the same function, still signs the head.
    assert await run_checkpoints(api.runtime.sessionmaker, api.runtime.kek) >= 1
    latest = (await auditor_get(api, "/v1/audit/checkpoints/latest")).json()
    assert latest["seq"] == head_seq


async def test_latest_is_the_newest_genuine_checkpoint_however_many_junk_rows(
    api: Api, owner_engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    tenant = await calls_of_one_agent(api, 3)
    assert await run_checkpoints(api.runtime.sessionmaker, api.runtime.kek) >= 1
    signed_seq, _ = await _head(owner_engine, tenant)
    await calls_of_one_agent(api, 12)
    head_seq, _ = await _head(owner_engine, tenant)
    kid = await _kid(owner_engine)
    # Under a real kid at every seq between the checkpoint and the head (more than a page),
    # and under a made-up kid far past the head (the red team's 20 rows, and more).
    await owner_execute(
        owner_engine, PLANT_JUNK, t=tenant, kid=kid, low=signed_seq + 1, high=head_seq
    )
    await owner_execute(owner_engine, PLANT_JUNK, t=tenant, kid="x", low=10**12, high=10**12 + 99)
    monkeypatch.setattr(audit_service, "_LATEST_PAGE", 5, raising=False)
    latest = await auditor_get(api, "/v1/audit/checkpoints/latest")
    assert latest.status_code == 200, latest.text
    assert (latest.json()["seq"], latest.json()["kid"]) == (signed_seq, kid)


async def test_an_unsigned_row_at_the_head_does_not_count_as_signed(
    api: Api, owner_engine: AsyncEngine
) -> None:
    """The due check counted any row at the head's seq as a checkpoint: rows planted ahead of
    the head silenced the signer, unnoticed. Now the head is due, and a seq that junk holds is
    logged rather than counted as made."""
    # The platform chain (its admin made this tenant through the API) is signed first, so the
    # tenant's head is the only one due below.
    await run_checkpoints(api.runtime.sessionmaker, api.runtime.kek)
    tenant = await calls_of_one_agent(api, 2)
    head_seq, _ = await _head(owner_engine, tenant)
    await owner_execute(owner_engine, PLANT_JUNK, t=tenant, kid="x", low=head_seq, high=head_seq)
    with structlog.testing.capture_logs() as logs:
        made = await run_checkpoints(api.runtime.sessionmaker, api.runtime.kek)
    assert made == 0
    taken = [entry for entry in logs if entry["event"] == "audit_checkpoint_seq_taken"]
    assert [(entry["tenant_id"], entry["seq"]) for entry in taken] == [(str(tenant), head_seq)]
    # The app login can no longer plant junk ahead (see the first test): the next head is signed.
    await calls_of_one_agent(api, 1)
    assert await run_checkpoints(api.runtime.sessionmaker, api.runtime.kek) == 1


async def test_verify_checks_a_bounded_number_of_junk_rows(
    api: Api, owner_engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """F2: verify checked the signature of every checkpoint past the last row (a million junk
    rows, ~30 s of CPU per call) and imported the key set again for each."""
    tenant = await calls_of_one_agent(api, 2)
    kid = await _kid(owner_engine)
    await owner_execute(owner_engine, PLANT_JUNK, t=tenant, kid=kid, low=10**9, high=10**9 + 1999)
    await owner_execute(owner_engine, PLANT_JUNK, t=tenant, kid="x", low=10**10, high=10**10 + 1999)
    checked: list[object] = []

    def counting(compact: str, jwks: Any) -> dict[str, Any] | None:
        checked.append(jwks)
        return verify_signature(compact, jwks)

    monkeypatch.setattr(audit_verify, "verify_signature", counting)
    report = await verify_report(api)
    assert (report["ok"], report["reason"]) == (True, None)
    assert 0 < len(checked) <= 200  # verify.MAX_BEYOND_CHECKED
    assert all(isinstance(keys, KeySet) for keys in checked)  # imported once, not per row
    assert len(report["unsigned_checkpoints"]) == audit_verify.MAX_UNSIGNED_LISTED
