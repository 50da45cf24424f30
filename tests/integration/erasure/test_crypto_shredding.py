"""Crypto-shredding: a tenant's memory text sealed under per-owner data keys kept outside
PostgreSQL; every read surface shows the text as before; erasing the owner destroys the key,
so a copy of the database taken before the erasure cannot yield the text (issue 16)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import text

from service.consolidation.jobs import CONSOLIDATION
from service.erasure import controller as erasure_controller
from service.erasure.files import scan
from service.shredding import FileKeyStore, KeyDestroyed, KeyStoreUnavailable, Vault
from service.transfer.run import export_record
from tests.fixtures.api import Agent, Api
from tests.fixtures.entrance import bypasses_visible
from tests.fixtures.replication import files_holding, started_copy
from tests.integration.erasure.support import make_eraser
from tests.integration.jobs.consolidation_support import (
    grant,
    job_principal,
    run_job,
    service_subject,
    team_space,
)
from tests.integration.memory.support import as_owner, assert_problem, count_memories
from tests.integration.tenants.support import platform

NOTE = "qx9-sealed-note Dana keeps the vendor escrow passphrase offline"
TEAM = "qx9-sealed-team the escrow rotation runs every quarter"
FIRST = "qx9-sealed-first the escrow window opens Monday"
SECOND = "qx9-sealed-second the escrow window opens Thursday"
PLAIN = "qx9-plain-control the other tenant stores this as text"


async def _configure(api: Api, **settings: object) -> dict[str, Any]:
    admin = await platform(api)
    response = await admin.http.patch(
        f"/v1/tenants/{api.tenant_id}", json={"settings": settings}, headers=admin.admin.headers
    )
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


async def _stored(api: Api, ids: list[str]) -> list[Any]:
    async with as_owner(api.runtime) as conn:
        rows = await conn.execute(
            text(
                "SELECT id, tenant_id, owner_id, value, value_key, value_sealed, "
                "lexical::text AS lexemes FROM memories WHERE id = ANY (CAST(:ids AS uuid[])) "
                "ORDER BY id"
            ),
            {"ids": ids},
        )
        return list(rows)


async def _relation_bytes(api: Api, needles: list[bytes]) -> list[int]:
    """How many of the memory table's (and its indexes' and TOAST's) files hold each needle,
    after a CHECKPOINT: the erasure proof's own scan."""
    maintenance = api.runtime.maintenance
    assert maintenance is not None
    directory, why = maintenance.local_data_directory()
    assert directory is not None, why
    assert maintenance.checkpoint()
    files = maintenance.relation_files(directory, ["memories"])
    found: list[int] = scan(files, needles)["found"]
    return found


async def test_a_shredding_tenant_reads_as_before_and_stores_no_text(api: Api) -> None:
    await _configure(api, crypto_shredding=True)
    dana, erin = await api.new_agent("dana"), await api.new_agent("erin")
    team = await team_space(api, "escrow", dana, erin)
    job = await job_principal(api)
    await grant(api, team, service_subject(job), "read", "write", "delete")
    note = await api.remember(dana, subject="service:vault", key="passphrase", value=NOTE)
    first = await api.remember(dana, subject="service:vault", key="window", value=FIRST)
    keyed = await api.http.post(
        "/v1/memories",
        json={"subject": "service:vault", "kind": "fact", "key": "window", "value": SECOND},
        headers=dana.headers | {"Idempotency-Key": "second-window"},
    )
    assert keyed.status_code == 201, keyed.text
    second = keyed.json()["memory"]
    team_fact = await api.remember(
        dana, subject="service:vault", key="rotation", value=TEAM, space_id=team
    )
    # Nothing in the row is the text: the value is "", the sealed value names its key.
    for row in await _stored(api, [note["id"], first["id"], second["id"], team_fact["id"]]):
        assert row.value == ""
        assert row.value_key is not None
        assert row.value_sealed is not None
        assert b"qx9-sealed" not in bytes(row.value_sealed)
        # The lexemes are made from the text at write time (not reached: see docs/erasure.md).
        assert "'escrow'" in row.lexemes or "'passphrase'" in row.lexemes

    # Every read surface shows the text, exactly as for a plaintext tenant.
    got = await api.http.get(f"/v1/memories/{note['id']}", headers=dana.headers)
    assert got.status_code == 200, got.text
    assert got.json()["value"] == NOTE
    listed = await api.http.get("/v1/memories", headers=dana.headers)
    values = {item["value"] for item in listed.json()["items"]}
    assert {NOTE, SECOND, TEAM} <= values
    for mode in ("vector", "hybrid"):
        found = await api.search(dana, "escrow passphrase offline", mode=mode)
        assert found.status_code == 200, found.text
        assert NOTE in [hit["memory"]["value"] for hit in found.json()["hits"]], mode
    # The lexical leg finds the words of a sealed row (its lexemes came from the plaintext).
    worded = await api.search(dana, "passphrase", mode="hybrid", min_score=0)
    hits = {hit["memory"]["id"]: hit for hit in worded.json()["hits"]}
    assert hits[note["id"]]["lexical_score"] is not None
    assert hits[note["id"]]["memory"]["value"] == NOTE
    history = await api.http.get(f"/v1/memories/{second['id']}/history", headers=dana.headers)
    assert [item["value"] for item in history.json()["items"]] == [SECOND, FIRST]
    # The export reads the list pages: its lines hold the text.
    exported = [export_record(item) for item in listed.json()["items"]]
    assert NOTE in {line["value"] for line in exported}
    # A replayed idempotent write answers the text too (its stored answer is sealed).
    replayed = await api.http.post(
        "/v1/memories",
        json={"subject": "service:vault", "kind": "fact", "key": "window", "value": SECOND},
        headers=dana.headers | {"Idempotency-Key": "second-window"},
    )
    assert replayed.status_code == 201, replayed.text
    assert replayed.json()["memory"]["value"] == SECOND
    # The consolidation job reads the opened text: the summary quotes it.
    run = await run_job(api.runtime, CONSOLIDATION, job)
    assert run.counts["summaries_written"] == 1, run.counts
    summaries = await api.http.get(
        "/v1/memories", params={"space_id": team, "kind": "summary"}, headers=erin.headers
    )
    [summary] = summaries.json()["items"]
    assert TEAM in summary["value"]

    # The table's files hold none of the sealed text, and the idempotency store none either;
    # another tenant's plaintext row is there (the scan sees what is stored as text).
    other = await api.other_tenant()
    carol = await other.new_agent("carol")
    await other.remember(carol, key="control", value=PLAIN)
    found_bytes = await _relation_bytes(api, [NOTE.encode(), TEAM.encode(), PLAIN.encode()])
    assert found_bytes[:2] == [0, 0], found_bytes
    assert found_bytes[2] > 0, found_bytes
    async with as_owner(api.runtime) as conn:
        answers = await conn.execute(
            text("SELECT answer FROM idempotency_keys WHERE tenant_id = :t"), {"t": api.tenant_id}
        )
        stored_answers = [bytes(row[0]) for row in answers if row[0] is not None]
    assert stored_answers
    assert all(b"qx9-sealed" not in one for one in stored_answers)


async def test_a_copy_taken_before_the_erasure_cannot_yield_the_text(api: Api) -> None:
    await _configure(api, crypto_shredding=True)
    await make_eraser(api)
    dana, erin = await api.new_agent("dana"), await api.new_agent("erin")
    team = await team_space(api, "escrow", dana, erin)
    job = await job_principal(api)
    await grant(api, team, service_subject(job), "read", "write", "delete")
    ids = [
        (await api.remember(dana, subject="service:vault", key="passphrase", value=NOTE))["id"],
        (
            await api.remember(
                dana, subject="service:vault", key="rotation", value=TEAM, space_id=team
            )
        )["id"],
    ]
    # A team summary built from her team note quotes it: sealed under a key of its own.
    assert (await run_job(api.runtime, CONSOLIDATION, job)).counts["summaries_written"] == 1
    summaries = await api.http.get(
        "/v1/memories", params={"space_id": team, "kind": "summary"}, headers=erin.headers
    )
    [summary] = summaries.json()["items"]
    assert TEAM in summary["value"]
    ids.append(summary["id"])
    # Control: another tenant stores its text as text, and the copy's files show it.
    other = await api.other_tenant()
    carol = await other.new_agent("carol")
    await other.remember(carol, key="control", value=PLAIN)
    needles = [NOTE.encode(), TEAM.encode(), PLAIN.encode()]
    database = str(api.runtime.settings.database.url).rsplit("/", 1)[-1].split("?")[0]
    vault = vault_of_runtime(api)

    # The copy: the whole cluster as a base backup would hold it, taken before the erasure.
    with started_copy(api.runtime.settings.database.url) as copy:
        copied = _sealed_rows(copy.url(database), ids)
        assert len(copied) == 3
        assert all(row["value"] == "" for row in copied)
        # Control: while the keys exist, the copy's ciphertext opens with memgate's key store.
        opened = {str(row["id"]): await vault.open(_Row(**row)) for row in copied}
        assert opened == {ids[0]: NOTE, ids[1]: TEAM, ids[2]: summary["value"]}

        planned = await api.http.post(
            "/v1/erasures",
            json={"owners": [dana.principal_id], "reason": "request 2026-200"},
            headers=api.admin.headers,
        )
        assert planned.status_code == 201, planned.text
        executed = await api.http.post(
            f"/v1/erasures/{planned.json()['id']}/execute",
            json={"version": planned.json()["version"]},
            headers=api.admin.headers,
        )
        assert executed.status_code == 200, executed.text
        claims = executed.json()["claims"]
        assert claims["keys"] == {"rows": 3, "sealed_rows": 3, "shredded_rows": 3, "owners": 1}
        assert claims["guarantees"]["wal_replicas_backups"].startswith("crypto-shredded")
        proof = await api.http.get(
            f"/v1/erasures/{planned.json()['id']}/proof", headers=api.admin.headers
        )
        keys = proof.json()["evidence"]["keys"]
        # Her key and the summary's own.
        assert (keys["pending"], keys["destroyed"]) == (0, 2), keys
        assert keys["copies"].startswith("unreadable: the text of 3 of the 3"), keys

        # The copy still holds the sealed rows: the erasure did not reach it ...
        after = _sealed_rows(copy.url(database), ids)
        assert [row["value_sealed"] for row in after] == [row["value_sealed"] for row in copied]
        # ... but no file of it (tables, indexes, TOAST, WAL) holds the sealed text, where the
        # plaintext tenant's is found,
        found = files_holding(copy.data, needles)
        assert found[:2] == [0, 0], found
        assert found[2] > 0, found
        # and the ciphertext does not open: not with this process's key store, nor with a new
        # one over the same folder and the same key-encryption key (another process).
        again = Vault(FileKeyStore(_key_dir(api)), api.runtime.kek)
        for row in after:
            for opener in (vault, again):
                with pytest.raises(KeyDestroyed):
                    await opener.open(_Row(**row))
    assert not any(_key_dir(api).rglob(f"{dana.principal_id}.key"))


async def _planned_for(api: Api, owner: Agent) -> tuple[dict[str, Any], str]:
    """A plan erasing `owner`, and the path that executes it."""
    planned = await api.http.post(
        "/v1/erasures",
        json={"owners": [owner.principal_id], "reason": "request 2026-201"},
        headers=api.admin.headers,
    )
    assert planned.status_code == 201, planned.text
    body: dict[str, Any] = planned.json()
    return body, f"/v1/erasures/{body['id']}/execute"


async def test_a_key_store_that_fails_erases_nothing_and_a_retry_finishes(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The keys die with the rows, in the execution's transaction: a store that fails there
    rolls the erasure back (503, nothing erased), and executing it again erases and shreds."""
    await _configure(api, crypto_shredding=True)
    await make_eraser(api)
    dana = await api.new_agent("dana")
    memory = await api.remember(dana, subject="service:vault", key="passphrase", value=NOTE)
    key_file = _key_dir(api) / api.tenant_id / f"{dana.principal_id}.key"
    assert key_file.is_file()
    assert oct(key_file.stat().st_mode & 0o777) == "0o600"
    assert oct(key_file.parent.stat().st_mode & 0o777) == "0o700"
    store = vault_of_runtime(api).store
    destroy = store.destroy

    async def down(*_: Any) -> uuid.UUID | None:
        raise KeyStoreUnavailable("the KMS does not answer")

    monkeypatch.setattr(store, "destroy", down)
    planned, execute = await _planned_for(api, dana)
    first = await api.http.post(execute, json={"version": 1}, headers=api.admin.headers)
    problem = assert_problem(first, 503, "service-unavailable")
    assert "Nothing was erased" in problem["detail"]
    assert "the KMS does not answer" in problem["detail"]
    assert key_file.is_file()
    kept = await api.http.get(f"/v1/memories/{memory['id']}", headers=dana.headers)
    assert kept.json()["value"] == NOTE  # the rows are there, and still read
    proof = await api.http.get(f"/v1/erasures/{planned['id']}/proof", headers=api.admin.headers)
    assert proof.json()["state"] == "planned"

    monkeypatch.setattr(store, "destroy", destroy)  # the KMS is back
    second = await api.http.post(execute, json={"version": 1}, headers=api.admin.headers)
    assert second.status_code == 200, second.text
    assert not key_file.exists()
    proof = await api.http.get(f"/v1/erasures/{planned['id']}/proof", headers=api.admin.headers)
    keys = proof.json()["evidence"]["keys"]
    assert (keys["pending"], keys["destroyed"]) == (0, 1), keys
    assert keys["copies"].startswith("unreadable"), keys
    third = await api.http.post(execute, json={"version": 1}, headers=api.admin.headers)
    assert third.json()["receipt"] == second.json()["receipt"]  # the same receipt again


async def test_a_process_dying_after_the_commit_is_finished_by_a_retry(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _configure(api, crypto_shredding=True)
    await make_eraser(api)
    dana = await api.new_agent("dana")
    await api.remember(dana, subject="service:vault", key="passphrase", value=NOTE)
    key_file = _key_dir(api) / api.tenant_id / f"{dana.principal_id}.key"

    async def died(*_: Any) -> None:  # the commit happened; the finalisation never ran
        return None

    monkeypatch.setattr(erasure_controller, "finalize_after", died)
    planned, execute = await _planned_for(api, dana)
    assert (await api.http.post(execute, json={"version": 1}, headers=api.admin.headers)).is_success
    proof = await api.http.get(f"/v1/erasures/{planned['id']}/proof", headers=api.admin.headers)
    # The key died with the commit; only the VACUUM is missing.
    assert not key_file.exists()
    assert proof.json()["evidence"]["keys"]["destroyed"] == 1
    assert proof.json()["evidence"]["finalized"] is False

    monkeypatch.undo()
    assert (await api.http.post(execute, json={"version": 1}, headers=api.admin.headers)).is_success
    evidence = (
        await api.http.get(f"/v1/erasures/{planned['id']}/proof", headers=api.admin.headers)
    ).json()["evidence"]
    assert (evidence["keys"]["pending"], evidence["keys"]["destroyed"]) == (0, 1)
    assert evidence["finalized"] is True  # the VACUUM it missed ran
    assert evidence["files_after"]["scanned"] is False


async def test_a_tenant_deletion_whose_key_store_fails_can_be_retried(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Red team: the tenant's keys were destroyed after the deletion's commit, with no way to
    retry once the tenant was gone. Now they die in its transaction: a failing store is a 503
    that deletes nothing, and the same confirmation deletes the tenant and its keys later."""
    admin = await platform(api)
    path = f"/v1/tenants/{api.tenant_id}"
    await _configure(api, crypto_shredding=True)
    dana = await api.new_agent("dana")
    await api.remember(dana, subject="service:vault", key="passphrase", value=NOTE)
    key_file = _key_dir(api) / api.tenant_id / f"{dana.principal_id}.key"
    assert key_file.is_file()
    store = vault_of_runtime(api).store

    async def down(*_: Any) -> list[uuid.UUID]:
        raise KeyStoreUnavailable("the KMS does not answer")

    monkeypatch.setattr(store, "destroy_tenant", down)
    disabled = await admin.http.post(f"{path}/disable", headers=admin.admin.headers)
    assert disabled.status_code == 200, disabled.text
    plan = (await admin.http.delete(path, headers=admin.admin.headers)).json()
    failed = await admin.http.delete(
        path, params={"confirm": plan["confirm"]}, headers=admin.admin.headers
    )
    assert_problem(failed, 503, "service-unavailable")
    assert key_file.is_file()
    assert (await admin.http.get(path, headers=admin.admin.headers)).status_code == 200

    monkeypatch.undo()
    done = await admin.http.delete(
        path, params={"confirm": plan["confirm"]}, headers=admin.admin.headers
    )
    assert done.status_code == 200, done.text
    assert not key_file.exists()
    proof = await admin.http.get(f"{path}/proof", headers=admin.admin.headers)
    keys = proof.json()["evidence"]["keys"]
    assert (keys["pending"], keys["destroyed"]) == (0, 1), keys
    assert keys["whole_tenant"] is True


async def test_the_mention_scan_reads_sealed_rows(api: Api) -> None:
    await _configure(api, crypto_shredding=True)
    await make_eraser(api)
    dana, erin = await api.new_agent("dana"), await api.new_agent("erin")
    team = await team_space(api, "escrow", dana, erin)
    mention = await api.remember(
        erin, subject="service:vault", key="owner", value="Dana Scully owns escrow", space_id=team
    )
    await api.remember(erin, subject="service:vault", key="other", value="nobody", space_id=team)
    planned = await api.http.post(
        "/v1/erasures",
        json={"owners": [dana.principal_id], "names": ["dana scully"], "reason": "req 2026-3"},
        headers=api.admin.headers,
    )
    assert planned.status_code == 201, planned.text
    assert [row["id"] for row in planned.json()["review"]] == [mention["id"]]


async def test_a_bad_setting_is_422_and_changes_nothing(api: Api) -> None:
    admin = await platform(api)
    before = await admin.http.get(f"/v1/tenants/{api.tenant_id}", headers=admin.admin.headers)
    refused = await admin.http.patch(
        f"/v1/tenants/{api.tenant_id}",
        json={"settings": {"crypto_shredding": "yes", "max_k": 5}},
        headers=admin.admin.headers,
    )
    problem = assert_problem(refused, 422, "tenant-settings-invalid")
    assert problem["field"] == "settings.crypto_shredding"
    assert problem["allowed"] == "true or false"
    after = await admin.http.get(f"/v1/tenants/{api.tenant_id}", headers=admin.admin.headers)
    assert after.json()["settings"] == before.json()["settings"]
    # Nothing sealed either: the tenant still stores text.
    dana = await api.new_agent("dana")
    written = await api.remember(dana, key="plain", value=PLAIN)
    [row] = await _stored(api, [written["id"]])
    assert (row.value, row.value_sealed) == (PLAIN, None)


async def test_kubernetes_with_the_file_store_refuses_to_turn_it_on(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What `KUBERNETES_SERVICE_HOST` sets once at start-up (ShreddingSettings.on_kubernetes).
    monkeypatch.setattr(vault_of_runtime(api), "_on_kubernetes", True)
    admin = await platform(api)
    refused = await admin.http.patch(
        f"/v1/tenants/{api.tenant_id}",
        json={"settings": {"crypto_shredding": True}},
        headers=admin.admin.headers,
    )
    problem = assert_problem(refused, 422, "tenant-settings-invalid")
    assert "KMS" in problem["detail"]
    after = await admin.http.get(f"/v1/tenants/{api.tenant_id}", headers=admin.admin.headers)
    assert "crypto_shredding" not in after.json()["settings"]


async def test_a_key_store_that_does_not_answer_is_a_503_that_writes_nothing(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A KMS (or key folder) that does not answer: writes and reads of sealed text answer 503
    `service-unavailable` saying what to do (retry), never a bare 500, and nothing is written."""
    await _configure(api, crypto_shredding=True)
    dana = await api.new_agent("dana")
    memory = await api.remember(dana, subject="service:vault", key="passphrase", value=NOTE)
    vault = vault_of_runtime(api)

    async def down(*_: Any) -> None:
        raise KeyStoreUnavailable("the KMS does not answer")

    monkeypatch.setattr(vault.store, "fetch", down)
    vault._cache.clear()  # as a process that has not opened this key yet
    before = await count_memories(api.runtime)
    written = await api.http.post(
        "/v1/memories",
        json={"subject": "service:vault", "kind": "fact", "key": "other", "value": TEAM},
        headers=dana.headers,
    )
    problem = assert_problem(written, 503, "service-unavailable")
    assert "data key store" in problem["detail"]
    assert "retry" in problem["detail"].lower()
    assert "the KMS does not answer" not in problem["detail"]  # the store's words stay inside
    assert await count_memories(api.runtime) == before
    read = await api.http.get(f"/v1/memories/{memory['id']}", headers=dana.headers)
    assert_problem(read, 503, "service-unavailable")


def vault_of_runtime(api: Api) -> Vault:
    vault = api.runtime.vault
    assert vault is not None
    return vault


def _key_dir(api: Api) -> Path:
    settings = api.runtime.settings
    return settings.shredding.key_dir(settings.database.data_dir)


class _Row:
    def __init__(self, **row: Any) -> None:
        self.tenant_id: uuid.UUID = row["tenant_id"]
        self.owner_id: uuid.UUID = row["owner_id"]
        self.id: uuid.UUID = row["id"]
        self.value_key: uuid.UUID | None = row["value_key"]
        self.value_sealed: bytes | None = row["value_sealed"]


def _sealed_rows(url: str, ids: list[str]) -> list[dict[str, Any]]:
    with (
        bypasses_visible("test oracle: the copy's stored rows, read as its superuser"),
        psycopg.connect(url) as conn,
        conn.cursor(row_factory=psycopg.rows.dict_row) as cursor,
    ):
        cursor.execute(
            "SELECT id, tenant_id, owner_id, value, value_key, value_sealed FROM memories "
            "WHERE id = ANY (%s::uuid[]) ORDER BY id",
            (ids,),
        )
        return [dict(row) | {"value_sealed": bytes(row["value_sealed"])} for row in cursor]
