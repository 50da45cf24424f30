"""`memgate audit checkpoint` (the CronJob's command) signs what the running app appended, with
the key the app's verify endpoint checks against."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from service.__main__ import main
from service.runtime import Runtime
from tests.fixtures.api import Api
from tests.integration.audit.support import auditor_get


async def test_audit_checkpoint_command(
    api: Api,
    runtime: Runtime,
    database_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    none_yet = await auditor_get(api, "/v1/audit/checkpoints/latest")
    assert none_yet.status_code == 404
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("MEMGATE_DATA_DIR", str(tmp_path / "cli"))
    monkeypatch.setenv("MEMGATE_KEY_ENCRYPTION_KEY", runtime.settings.auth.key_encryption_key)
    assert await asyncio.to_thread(main, ["audit", "checkpoint"]) == 0
    made = capsys.readouterr().out
    # Two chains so far: the platform tenant's (its admin created the tenant through the API)
    # and the tenant's.
    assert "signed 2 audit checkpoint(s)" in made

    checkpoint = (await auditor_get(api, "/v1/audit/checkpoints/latest")).json()
    report = (await auditor_get(api, "/v1/audit/verify")).json()
    assert report["ok"] is True
    assert report["checkpoint"]["seq"] == checkpoint["seq"]
    assert report["checkpoint"]["signature_valid"] is True
    # The reads above grew the chain again (they are audited too): signed again, once.
    assert await asyncio.to_thread(main, ["audit", "checkpoint"]) == 0
    assert "signed 1 audit checkpoint(s)" in capsys.readouterr().out
