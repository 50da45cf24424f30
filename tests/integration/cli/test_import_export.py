"""`memgate import` and `memgate export` against one real `memgate serve` (embedded
PostgreSQL) for the module: 10k memories with progress, killed and resumed without a loss or a
duplicate; an export that round-trips into another tenant; mem0 and Zep files; a batch with one
bad record writes nothing."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.cli.test_embedded_lifecycle import MEMGATE, Server, _free_port

FIXTURES = Path(__file__).parents[2] / "fixtures" / "transfer"
TEN_THOUSAND = 10_000


@dataclass(frozen=True)
class Tenant:
    client_id: str
    secret_file: Path

    def args(self) -> list[str]:
        return ["--client-id", self.client_id, "--client-secret-file", str(self.secret_file)]

    def headers(self, server: Server) -> dict[str, str]:
        answer = httpx.post(
            f"{server.url}/oauth/token",
            data={"grant_type": "client_credentials"},
            auth=(self.client_id, self.secret_file.read_text().strip()),
            timeout=10,
        )
        assert answer.status_code == 200, answer.text
        return {"Authorization": f"Bearer {answer.json()['access_token']}"}


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    root = Path(tempfile.mkdtemp(prefix="memgate-port-"))
    env = {
        **os.environ,
        "MEMGATE_DATA_DIR": str(root / "data"),
        "MEMGATE_HOST": "127.0.0.1",
        "MEMGATE_METRICS_PORT": str(_free_port()),
    }
    port = _free_port()
    env["MEMGATE_PORT"] = str(port)
    env.pop("DATABASE_URL", None)
    env.pop("MEMGATE_MIGRATION_DATABASE_URL", None)
    served = Server(root / "data", port, env, serve_args=("--workers", "1"))
    try:
        served.start()
        yield served
    finally:
        served.kill_everything()
        shutil.rmtree(root, ignore_errors=True)


def new_tenant(server: Server, name: str) -> Tenant:
    done = server.run("tenants", "create", name)
    assert done.returncode == 0, done.stderr
    admin = json.loads(done.stdout)["admin"]
    return Tenant(admin["client_id"], Path(admin["client_secret_file"]))


def memories(server: Server, tenant: Tenant) -> list[dict[str, Any]]:
    headers, found, cursor = tenant.headers(server), [], None
    while True:
        params = {"limit": "100", **({"cursor": cursor} if cursor else {})}
        page = httpx.get(f"{server.url}/v1/memories", params=params, headers=headers, timeout=30)
        assert page.status_code == 200, page.text
        found += page.json()["items"]
        cursor = page.json()["next_cursor"]
        if cursor is None:
            return found


def created_by_batches(server: Server, tenant: Tenant) -> int:
    """Memories the batch writes created, by their audit rows (a replay creates none)."""
    headers, total, cursor = tenant.headers(server), 0, None
    while True:
        params = {"action": "memory.write_batch", "limit": "100"}
        if cursor:
            params["cursor"] = cursor
        page = httpx.get(
            f"{server.url}/v1/audit/events", params=params, headers=headers, timeout=30
        )
        assert page.status_code == 200, page.text
        for row in page.json()["items"]:
            if row["reason"].startswith("batch:"):
                total += int(row["reason"].split("created=")[1].split(",")[0])
        cursor = page.json()["next_cursor"]
        if cursor is None:
            return total


def test_ten_thousand_memories_import_with_progress_and_resume_after_a_kill(
    server: Server, tmp_path: Path
) -> None:
    tenant = new_tenant(server, "bulk")
    source = tmp_path / "bulk.jsonl"
    with source.open("w") as out:
        for i in range(TEN_THOUSAND):
            record = {"subject": f"user:{i % 97}", "kind": "fact", "key": f"bulk.{i}"}
            out.write(json.dumps(record | {"value": f"bulk memory {i}"}) + "\n")
    # 600 a batch is more than the server's 500 (MEMGATE_BATCH_MAX_ITEMS): its 422 names 500
    # (`max_items`), the import splits that batch and sends 500 at a time from then on.
    command = [*MEMGATE, "import", str(source), *tenant.args(), "--url", server.url]
    command += ["--batch-size", "600"]
    first = subprocess.Popen(  # noqa: S603 (our own CLI)
        command, env=server.env, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert first.stderr is not None
    progress: list[str] = []
    while len(progress) < 3:  # three batches committed, then a kill mid-import
        line = first.stderr.readline()
        assert line, first.wait()
        progress.append(line)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    assert all(line.startswith("memgate import: ") for line in progress)
    assert "/s" in progress[-1]
    assert "ETA" in progress[-1]
    assert f"% of {source.stat().st_size} bytes" in progress[0]
    state = json.loads((tmp_path / "bulk.jsonl.state").read_text())
    assert state["position"]["offset"] > 0
    assert state["imported"] >= 1500
    assert state["batch_size"] == 500
    assert state["imported"] < TEN_THOUSAND

    again = subprocess.run(  # noqa: S603 (our own CLI)
        command, env=server.env, capture_output=True, text=True, timeout=600, check=False
    )
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["imported"] == TEN_THOUSAND
    assert not (tmp_path / "bulk.jsonl.state").exists()
    listed = memories(server, tenant)
    assert len(listed) == TEN_THOUSAND
    assert len({m["key"] for m in listed}) == TEN_THOUSAND
    assert {m["version"] for m in listed} == {1}  # nothing written twice (no second version)
    assert created_by_batches(server, tenant) == TEN_THOUSAND


def _comparable(path: Path) -> list[dict[str, Any]]:
    """Export lines without what an import changes: ids, times and provenance."""
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for line in lines:
        line["metadata"].pop("memgate.provenance")
        line.pop("expires_at", None)
    return sorted(lines, key=lambda line: (line["subject"], line["key"]))


def test_an_export_imported_into_another_tenant_exports_the_same(
    server: Server, tmp_path: Path
) -> None:
    alpha, beta = new_tenant(server, "alpha"), new_tenant(server, "beta")
    source = tmp_path / "alpha.jsonl"
    with source.open("w") as out:
        for i in range(230):  # three export pages
            record: dict[str, Any] = {
                "subject": f"service:s{i % 5}",
                "kind": ["fact", "decision", "preference"][i % 3],
                "key": f"rt.{i}",
                "value": f"round trip {i} ünïcode",
                "metadata": {"i": i, "tags": ["a", "b"]},
                "source": "fixture",
                "valid_from": "2025-01-01T00:00:00Z",
            }
            if i % 10 == 0:
                record["ttl_seconds"] = 86_400
            out.write(json.dumps(record) + "\n")
    url = ["--url", server.url]
    first = server.run("import", str(source), *alpha.args(), *url, "--batch-size", "100")
    assert first.returncode == 0, first.stderr
    exported = tmp_path / "alpha-export.jsonl"
    done = server.run("export", str(exported), *alpha.args(), *url)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["exported"] == 230
    assert done.stderr.count("memgate export: ") >= 3
    into_beta = server.run("import", str(exported), *beta.args(), *url)
    assert into_beta.returncode == 0, into_beta.stderr
    again = tmp_path / "beta-export.jsonl"
    assert server.run("export", str(again), *beta.args(), *url).returncode == 0
    assert _comparable(again) == _comparable(exported)
    assert len(_comparable(again)) == 230
    lines = [json.loads(line) for line in again.read_text().splitlines()]
    expiring = [line for line in lines if "expires_at" in line]
    assert len(expiring) == 23
    # The copy says where it came from: alpha's export, not beta's own rows.
    origin = {line["metadata"]["memgate.provenance"]["id"] for line in lines}
    assert origin.isdisjoint(
        {
            json.loads(x)["metadata"]["memgate.provenance"]["id"]
            for x in exported.read_text().splitlines()
        }
    )


def test_an_interrupted_export_resumes_by_its_cursor(server: Server, tmp_path: Path) -> None:
    tenant = new_tenant(server, "pages")
    source = tmp_path / "pages.jsonl"
    source.write_text(
        "".join(
            json.dumps({"subject": "s", "kind": "fact", "key": f"p.{i}", "value": f"v{i}"}) + "\n"
            for i in range(250)
        )
    )
    url = ["--url", server.url]
    assert server.run("import", str(source), *tenant.args(), *url).returncode == 0
    target = tmp_path / "pages-export.jsonl"
    whole = tmp_path / "whole.jsonl"
    assert server.run("export", str(whole), *tenant.args(), *url).returncode == 0
    # As a kill leaves it: one page checkpointed, half of the next one written.
    lines = whole.read_text().splitlines(keepends=True)
    first_page = "".join(lines[:100])
    target.write_text(first_page + "".join(lines[100:140]) + lines[140][:10])
    headers = tenant.headers(server)
    page = httpx.get(f"{server.url}/v1/memories", params={"limit": "100"}, headers=headers)
    state = {
        "cursor": page.json()["next_cursor"],
        "written": 100,
        "bytes": len(first_page.encode()),
    }
    (tmp_path / "pages-export.jsonl.state").write_text(json.dumps(state))
    done = server.run("export", str(target), *tenant.args(), *url)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["exported"] == 250
    assert _comparable(target) == _comparable(whole)


def test_mem0_and_zep_exports_import(server: Server, tmp_path: Path) -> None:
    tenant = new_tenant(server, "movers")
    url = ["--url", server.url]
    for name, fmt in (("mem0_export.jsonl", "mem0"), ("zep_export.jsonl", "zep")):
        copy = tmp_path / name
        shutil.copy(FIXTURES / name, copy)
        done = server.run("import", str(copy), "--format", fmt, *tenant.args(), *url)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["skipped"] == 1
    listed = memories(server, tenant)
    found = {(m["subject"], m["kind"], m["value"]) for m in listed}
    assert found == {
        ("user:alex", "fact", "Prefers vegetarian food"),
        ("user:alex", "fact", "Allergic to peanuts"),
        ("agent:ops-bot", "fact", "Deploys the billing service on Fridays"),
        ("user:alex", "fact", "Alex works at Acme as a data engineer"),
        ("user:alex", "episode", "Alex: I moved to Porto last month."),
        ("user:alex", "episode", "assistant: Noted, Porto it is."),
        ("session:planning", "episode", "Quarterly planning notes: ship the importer"),
    }
    by_value = {m["value"]: m for m in listed}
    assert by_value["Allergic to peanuts"]["metadata"]["mem0"]["categories"] == ["health"]
    assert by_value["Allergic to peanuts"]["valid_from"].startswith("2024-07-21T10:00:00")
    assert (
        by_value["Alex works at Acme as a data engineer"]["metadata"]["zep"]["name"] == "WORKS_AT"
    )


def test_a_batch_with_one_bad_record_writes_nothing(server: Server, tmp_path: Path) -> None:
    tenant = new_tenant(server, "strict")
    source = tmp_path / "bad.jsonl"
    good = [{"subject": "s", "kind": "fact", "key": f"g.{i}", "value": "fine"} for i in range(5)]
    bad = {"subject": "s", "kind": "fact", "key": "too.long", "value": "x" * 20_000}
    source.write_text("".join(json.dumps(r) + "\n" for r in [*good[:3], bad, *good[3:]]))
    url = ["--url", server.url]
    done = server.run("import", str(source), *tenant.args(), *url)
    assert done.returncode == 1
    assert "line 4" in done.stderr
    assert "nothing of it was written" in done.stderr
    assert memories(server, tenant) == []
    skipping = server.run("import", str(source), *tenant.args(), *url, "--skip-invalid")
    assert skipping.returncode == 0, skipping.stderr
    assert json.loads(skipping.stdout) | {"seconds": 0} == {
        "imported": 5,
        "replayed": 0,
        "skipped": 0,
        "rejected": 1,
        "seconds": 0,
    }
    assert sorted(m["key"] for m in memories(server, tenant)) == [f"g.{i}" for i in range(5)]


def test_the_bootstrap_admin_is_the_default_client(server: Server, tmp_path: Path) -> None:
    source = tmp_path / "admin.jsonl"
    source.write_text(json.dumps({"subject": "s", "kind": "fact", "key": "a", "value": "v"}))
    started = time.monotonic()
    done = server.run("import", str(source), "--url", server.url)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["imported"] == 1
    assert time.monotonic() - started < 60


def _facts(path: Path, n: int = 3, value: str = "original") -> None:
    lines = (
        json.dumps(
            {"subject": "service:rt", "kind": "fact", "key": f"rt.{i}", "value": f"{value} {i}"}
        )
        for i in range(n)
    )
    path.write_text("".join(line + "\n" for line in lines))


def test_an_export_file_is_readable_by_its_owner_only(server: Server, tmp_path: Path) -> None:
    tenant = new_tenant(server, "modes")
    source = tmp_path / "in.jsonl"
    _facts(source, value="a private note")
    url = ["--url", server.url]
    assert server.run("import", str(source), *tenant.args(), *url).returncode == 0
    fresh, reused = tmp_path / "out.jsonl", tmp_path / "old.jsonl"
    reused.write_text("an older file\n")
    reused.chmod(0o644)
    old = os.umask(0o022)  # the usual login umask
    try:
        done = [server.run("export", str(path), *tenant.args(), *url) for path in (fresh, reused)]
    finally:
        os.umask(old)
    assert [one.returncode for one in done] == [0, 0], [one.stderr for one in done]
    for path in (fresh, reused):  # every memory value of the tenant: not for other users
        assert "a private note" in path.read_text()
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_importing_a_file_again_writes_it_again(server: Server, tmp_path: Path) -> None:
    """A finished import leaves no state: running it again (within the keys' 24 h) is a new
    run, not a retry of the first one's batches (whose answers the server still keeps)."""
    tenant = new_tenant(server, "again")
    source = tmp_path / "notes.jsonl"
    _facts(source)
    url = ["--url", server.url]
    assert server.run("import", str(source), *tenant.args(), *url).returncode == 0
    headers = tenant.headers(server)
    [victim] = [m for m in memories(server, tenant) if m["key"] == "rt.1"]
    gone = httpx.delete(f"{server.url}/v1/memories/{victim['id']}", headers=headers, timeout=30)
    assert gone.status_code == 204, gone.text
    changed = httpx.post(
        f"{server.url}/v1/memories",
        json={"subject": "service:rt", "kind": "fact", "key": "rt.0", "value": "changed"},
        headers=headers,
        timeout=30,
    )
    assert changed.status_code == 201, changed.text
    again = server.run("import", str(source), *tenant.args(), *url)
    assert again.returncode == 0, again.stderr  # not 410 idempotency-answer-gone
    assert json.loads(again.stdout) | {"seconds": 0} == {
        "imported": 3,
        "replayed": 0,
        "skipped": 0,
        "rejected": 0,
        "seconds": 0,
    }
    values = {m["key"]: m["value"] for m in memories(server, tenant)}
    assert values == {"rt.0": "original 0", "rt.1": "original 1", "rt.2": "original 2"}


def test_the_state_file_is_not_written_through_a_planted_symlink(
    server: Server, tmp_path: Path
) -> None:
    tenant = new_tenant(server, "symlink")
    source = tmp_path / "shared.jsonl"
    _facts(source)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    # Another user of a shared directory plants the temporary name the state was saved under.
    (tmp_path / "shared.jsonl.state.tmp").symlink_to(victim)
    done = server.run("import", str(source), *tenant.args(), "--url", server.url)
    assert done.returncode == 0, done.stderr
    assert victim.read_text() == "precious\n"


def test_a_deeply_nested_line_is_a_one_line_error(server: Server, tmp_path: Path) -> None:
    tenant = new_tenant(server, "deep")
    source = tmp_path / "deep.jsonl"
    nested = "[" * 100_000 + "]" * 100_000
    source.write_text(
        f'{{"subject": "s", "kind": "fact", "key": "k", "value": "v", "metadata": {nested}}}\n'
    )
    done = server.run("import", str(source), *tenant.args(), "--url", server.url)
    assert done.returncode == 1, done.stderr[-500:]
    assert "Traceback" not in done.stderr, done.stderr[-800:]
    assert done.stderr.startswith(f"memgate import: {source}:1: "), done.stderr[-800:]
    assert len(done.stderr.splitlines()) == 1
