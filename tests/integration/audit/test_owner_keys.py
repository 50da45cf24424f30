"""Red-team follow-up: audit keys and checkpoints are the owner's. The app login planted an audit
key (calls stopped for good; a key it held signed checkpoints that verified) and an unsigned
checkpoint of another tenant (whose verify then reported a cut tail for ever)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
import structlog
from joserfc import jws
from joserfc.jwk import OKPKey
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from service.__main__ import main
from service.audit.checkpoints import (
    CheckpointClaims,
    ensure_audit_key,
    rotate_audit_key,
    run_checkpoints,
)
from service.auth.keys import WrongKeyEncryptionKey
from service.db.session import create_sessionmaker
from service.settings import AuditSettings, Settings
from tests.conftest import make_settings
from tests.fixtures.api import Api
from tests.integration.audit.support import (
    auditor_get,
    calls_of_one_agent,
    owner_execute,
    verify_report,
)

EVERY_ROWS = 5
PLANT_KEY = (
    "INSERT INTO audit_signing_keys (kid, public_jwk, private_key_encrypted, created_at, "
    "retired_at) VALUES (:kid, CAST(:jwk AS jsonb), '\\x00', now() + interval '1 day', :retired)"
)
PLANT_CHECKPOINT = (
    "INSERT INTO audit_checkpoints (tenant_id, seq, row_hash, signed_at, kid, jws) "
    "VALUES (:t, :seq, :hash, now(), :kid, :jws)"
)


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    base = make_settings(database_url, tmp_path)
    return dataclasses.replace(
        base, audit=AuditSettings(checkpoint_seconds=0, checkpoint_rows=EVERY_ROWS)
    )


def _attacker_key(kid: str) -> OKPKey:
    return OKPKey.generate_key("Ed25519", parameters={"kid": kid, "alg": "Ed25519"})


def _sqlstate(error: pytest.ExceptionInfo[DBAPIError]) -> str | None:
    return getattr(error.value.orig, "sqlstate", None)


async def _kids(api: Api) -> list[str]:
    response = await auditor_get(api, "/v1/audit/keys")
    assert response.status_code == 200
    return [key["kid"] for key in response.json()["keys"]]


async def _checkpoint_kids(owner: AsyncEngine, tenant: uuid.UUID) -> dict[int, str]:
    async with owner.connect() as conn:
        rows = await conn.execute(
            text("SELECT seq, kid FROM audit_checkpoints WHERE tenant_id = :t ORDER BY seq"),
            {"t": tenant},
        )
        return {int(seq): str(kid) for seq, kid in rows.all()}


@pytest.mark.parametrize("retired", [None, "now"])
async def test_the_app_login_cannot_plant_an_audit_key(api: Api, retired: str | None) -> None:
    """Neither a newest unretired key (calls stopped) nor a retired one whose private half the
    attacker holds (its checkpoints verified)."""
    await calls_of_one_agent(api, 1)
    before = await _kids(api)
    key = _attacker_key("planted")
    with pytest.raises(DBAPIError) as refused:
        async with api.runtime.engine.begin() as conn:  # the app's login, no tenant named
            await conn.execute(
                text(PLANT_KEY.replace(":retired", "now()" if retired else "NULL")),
                {"kid": "planted", "jwk": json.dumps(key.as_dict(private=False))},
            )
    assert _sqlstate(refused) == "42501"
    assert await _kids(api) == before
    assert "planted" not in before


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE audit_signing_keys SET public_jwk = '{}'::jsonb",
        "DELETE FROM audit_signing_keys",
        "TRUNCATE audit_signing_keys",
    ],
)
async def test_the_app_login_cannot_change_or_drop_audit_keys(api: Api, statement: str) -> None:
    before = await _kids(api)
    with pytest.raises(DBAPIError) as refused:
        async with api.runtime.engine.begin() as conn:
            await conn.execute(text(statement))
    assert _sqlstate(refused) == "42501"
    assert await _kids(api) == before


async def test_the_service_makes_its_audit_key_as_the_owner(api: Api) -> None:
    """Made at start (the runtime fixture passes the owner's URL), before any checkpoint."""
    kids = await _kids(api)
    assert len(kids) == 1
    assert kids[0].startswith("audit-")


async def test_a_newest_key_it_cannot_open_does_not_stop_signing(
    api: Api, owner_engine: AsyncEngine
) -> None:
    """The red team's case (planted here as the owner, as a grant put back by hand would let the
    app): the signer used the newest unretired key, could not unseal it, and every call at
    seq % N == 0 failed with 503 for good."""
    (own_kid,) = await _kids(api)
    key = _attacker_key("planted")
    await owner_execute(
        owner_engine,
        PLANT_KEY.replace(":retired", "NULL"),
        kid="planted",
        jwk=json.dumps(key.as_dict(private=False)),
    )
    alice = await api.new_agent("alice")
    statuses = [
        (await api.http.get("/v1/memories", headers=alice.headers)).status_code
        for _ in range(3 * EVERY_ROWS)
    ]
    assert statuses == [200] * (3 * EVERY_ROWS)
    tenant = uuid.UUID(api.tenant_id)
    signed = await _checkpoint_kids(owner_engine, tenant)
    assert signed  # the rows at multiples of N were signed, with the key it can open
    assert all(seq % EVERY_ROWS == 0 for seq in signed)
    assert set(signed.values()) == {own_kid}


async def test_a_checkpoint_that_cannot_be_signed_never_fails_the_call(
    api: Api, owner_engine: AsyncEngine, settings: Settings
) -> None:
    """No key this process can open: the calls go on (the failure is logged), and the timed
    signer signs the head once the owner has made a key."""
    await owner_execute(
        owner_engine,
        "UPDATE audit_signing_keys SET retired_at = now()",
        PLANT_KEY.replace(":retired", "NULL"),
        kid="unopenable",
        jwk=json.dumps(_attacker_key("unopenable").as_dict(private=False)),
    )
    alice = await api.new_agent("alice")
    with structlog.testing.capture_logs() as logs:
        statuses = [
            (await api.http.get("/v1/memories", headers=alice.headers)).status_code
            for _ in range(2 * EVERY_ROWS)
        ]
    assert statuses == [200] * (2 * EVERY_ROWS)
    skipped = [entry for entry in logs if entry["event"] == "audit_checkpoint_not_signed"]
    assert skipped
    assert {entry["reason"] for entry in skipped} == {"no usable audit signing key"}
    tenant = uuid.UUID(api.tenant_id)
    assert await _checkpoint_kids(owner_engine, tenant) == {}
    report = await verify_report(api)
    assert report["ok"] is True  # every call was recorded, in one unbroken chain
    assert report["checked"] >= 2 * EVERY_ROWS

    async with api.runtime.sessionmaker.begin() as session:  # the app still cannot make one
        with pytest.raises(DBAPIError):
            await rotate_audit_key(session, api.runtime.kek)
    # the owner is not handed a key beside one it cannot open (another key-encryption key's):
    # retiring it is a deliberate `memgate keys rotate-audit`
    async with create_sessionmaker(owner_engine).begin() as session:
        with pytest.raises(WrongKeyEncryptionKey, match="1 unretired audit signing key"):
            await ensure_audit_key(session, api.runtime.kek)
    async with create_sessionmaker(owner_engine).begin() as session:
        await rotate_audit_key(session, api.runtime.kek)
    assert await run_checkpoints(api.runtime.sessionmaker, api.runtime.kek) >= 1
    latest = (await auditor_get(api, "/v1/audit/checkpoints/latest")).json()
    assert latest["kid"] not in {"unopenable"}
    report = await verify_report(api)
    assert report["ok"] is True
    assert report["checkpoint"]["signature_valid"] is True


async def test_migrate_makes_the_audit_key_as_the_owner(
    settings: Settings, owner_engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", settings.database.url)
    monkeypatch.setenv("MEMGATE_DATA_DIR", str(settings.database.data_dir))
    monkeypatch.setenv("MEMGATE_KEY_ENCRYPTION_KEY", settings.auth.key_encryption_key)
    assert await asyncio.to_thread(main, ["migrate"]) == 0
    assert await asyncio.to_thread(main, ["migrate"]) == 0  # idempotent: still one key
    async with owner_engine.connect() as conn:
        kids = (
            await conn.execute(text("SELECT kid FROM audit_signing_keys WHERE retired_at IS NULL"))
        ).scalars()
        assert len(list(kids)) == 1


# Finding 2: checkpoints.


async def test_the_app_login_writes_checkpoints_only_for_the_tenant_it_named(api: Api) -> None:
    tenant = await calls_of_one_agent(api, 2)
    other = await api.other_tenant()
    junk = {"t": tenant, "seq": 1_000_000_000, "hash": b"\x00", "kid": "none", "jws": "junk"}
    for named in ("", other.tenant_id):
        async with api.runtime.engine.begin() as conn:
            await conn.execute(
                text("SELECT set_config('memgate.tenant_id', :t, true)"), {"t": named}
            )
            with pytest.raises(DBAPIError) as refused:
                await conn.execute(text(PLANT_CHECKPOINT), junk)
            assert _sqlstate(refused) == "42501", named
    report = await verify_report(api)
    assert (report["ok"], report["reason"]) == (True, None)


async def test_an_unsigned_checkpoint_beyond_the_chain_is_reported_not_a_cut(
    api: Api, owner_engine: AsyncEngine
) -> None:
    """A junk row (planted before the fix, or by a login that named the tenant) proves nothing:
    it is listed, and the chain still verifies."""
    tenant = await calls_of_one_agent(api, 3)
    junk = {"t": tenant, "seq": 1_000_000_000, "hash": b"\x00", "kid": "none", "jws": "junk"}
    await owner_execute(owner_engine, PLANT_CHECKPOINT, **junk)
    # Signed, but by a key that is not an audit key: no better than junk.
    stranger = _attacker_key("stranger")
    claims = CheckpointClaims(tenant, 2_000_000_000, bytes(32), datetime.now(UTC))
    forged = jws.serialize_compact(
        {"alg": "Ed25519", "kid": "stranger"}, claims.payload(), stranger, algorithms=["Ed25519"]
    )
    await owner_execute(
        owner_engine,
        PLANT_CHECKPOINT,
        t=tenant,
        seq=2_000_000_000,
        hash=bytes(32),
        kid="stranger",
        jws=forged,
    )
    report = await verify_report(api)
    assert (report["ok"], report["first_bad_seq"], report["reason"]) == (True, None, None)
    assert report["unsigned_checkpoints"] == [1_000_000_000, 2_000_000_000]
    latest = await auditor_get(api, "/v1/audit/checkpoints/latest")
    assert latest.status_code == 200
    assert latest.json()["seq"] % EVERY_ROWS == 0  # the row-N checkpoint; junk is never served
    assert latest.json()["kid"] not in {"none", "stranger"}


async def test_the_timed_signer_signs_every_tenant_under_row_level_security(api: Api) -> None:
    await calls_of_one_agent(api, 2)
    other = await api.other_tenant()
    await calls_of_one_agent(other, 2)
    made = await run_checkpoints(api.runtime.sessionmaker, api.runtime.kek)
    assert made >= 2
    for each in (api, other):
        report = await verify_report(each)
        assert report["ok"] is True
        assert report["checkpoint"]["signature_valid"] is True
        assert report["unsigned_checkpoints"] == []
