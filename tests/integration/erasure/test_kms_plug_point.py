"""The KMS plug point end to end: `MEMGATE_DATA_KEY_STORE=module:factory` names the store the
runtime seals with (here a stand-in for a KMS shared by every replica), on Kubernetes too."""

from __future__ import annotations

import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from service.settings import Settings, ShreddingSettings
from tests.conftest import make_settings
from tests.fixtures.api import Api
from tests.fixtures.kms import MemoryKms
from tests.integration.erasure.support import make_eraser
from tests.integration.tenants.support import platform


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    shredding = ShreddingSettings(data_key_store="tests.fixtures.kms:MemoryKms", on_kubernetes=True)
    return replace(make_settings(database_url, tmp_path), shredding=shredding)


async def test_a_kms_store_named_by_the_setting_seals_and_shreds(api: Api) -> None:
    vault = api.runtime.vault
    assert vault is not None
    kms = vault.store
    assert isinstance(kms, MemoryKms)
    admin = await platform(api)
    # A shared store: turning it on is allowed on Kubernetes (the file store is refused there).
    turned = await admin.http.patch(
        f"/v1/tenants/{api.tenant_id}",
        json={"settings": {"crypto_shredding": True}},
        headers=admin.admin.headers,
    )
    assert turned.status_code == 200, turned.text
    dana = await api.new_agent("dana")
    written = await api.remember(dana, key="escrow", value="qx9-kms the escrow lives offline")
    got = await api.http.get(f"/v1/memories/{written['id']}", headers=dana.headers)
    assert got.json()["value"] == "qx9-kms the escrow lives offline"
    tenant, owner = uuid.UUID(api.tenant_id), uuid.UUID(dana.principal_id)
    assert (tenant, owner) in kms.keys
    assert b"qx9" not in kms.keys[(tenant, owner)].wrapped
    settings = api.runtime.settings
    assert not settings.shredding.key_dir(settings.database.data_dir).exists()  # no file store

    await make_eraser(api)
    planned = (
        await api.http.post(
            "/v1/erasures",
            json={"owners": [dana.principal_id], "reason": "request 2026-300"},
            headers=api.admin.headers,
        )
    ).json()
    executed = await api.http.post(
        f"/v1/erasures/{planned['id']}/execute", json={"version": 1}, headers=api.admin.headers
    )
    assert executed.status_code == 200, executed.text
    assert (tenant, owner) not in kms.keys
