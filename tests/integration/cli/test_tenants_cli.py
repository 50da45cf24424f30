"""`memgate tenants create|list|disable|enable` against a real running `serve`: the operator
(the bootstrap admin of the data dir, the platform admin) onboards a tenant whose admin works at
once over HTTP, disables it (its tokens stop on the next request) and enables it, while the
server and its embedded database keep running; every action is audited in the platform chain."""

from __future__ import annotations

import json
import os
import signal
import stat
from pathlib import Path
from typing import Any

import httpx

from tests.integration.cli.test_embedded_lifecycle import Server, _alive, _postmaster_pid, server

__all__ = ["server"]  # the fixture, used by name


def _json(server: Server, *args: str) -> Any:
    done = server.run("tenants", *args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_tenant_lifecycle_through_the_cli(server: Server) -> None:
    server.start()
    postmaster = _postmaster_pid(server.data_dir)
    created = _json(server, "create", "initech")
    tenant_id = created["tenant"]["tenant_id"]
    admin = created["admin"]
    # The secret is in a 0600 file, never on the terminal.
    assert "client_secret" not in admin
    secret_file = Path(admin["client_secret_file"])
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    secret = secret_file.read_text().strip()
    assert secret.startswith("mgs_")
    assert secret not in json.dumps(created)

    # The new tenant's admin works at once, over the running server.
    token = httpx.post(
        f"{server.url}/oauth/token",
        data={"grant_type": "client_credentials"},
        auth=(admin["client_id"], secret),
        timeout=10,
    )
    assert token.status_code == 200, token.text
    headers = {"Authorization": f"Bearer {token.json()['access_token']}"}
    own = httpx.get(f"{server.url}/v1/principals", headers=headers, timeout=10)
    assert own.status_code == 200, own.text
    assert [p["id"] for p in own.json()["items"]] == [admin["principal_id"]]

    listed = _json(server, "list")["items"]
    assert {t["name"] for t in listed} == {"default", "initech"}
    assert [t["is_platform"] for t in listed if t["name"] == "default"] == [True]

    disabled = _json(server, "disable", tenant_id)
    assert disabled["disabled_at"] is not None
    refused = httpx.get(f"{server.url}/v1/principals", headers=headers, timeout=10)
    assert refused.status_code == 401, refused.text
    enabled = _json(server, "enable", tenant_id)
    assert enabled["disabled_at"] is None
    again = httpx.get(f"{server.url}/v1/principals", headers=headers, timeout=10)
    assert again.status_code == 200, again.text

    # Refusals are one line naming the problem, and change nothing.
    bad = server.run("tenants", "disable", "not-an-id")
    assert bad.returncode == 1
    assert "malformed-id" in bad.stderr
    platform_id = next(t["tenant_id"] for t in listed if t["is_platform"])
    locked = server.run("tenants", "disable", platform_id)
    assert locked.returncode == 1
    assert "platform-tenant-locked" in locked.stderr

    # Audited in the platform chain, read by the platform admin over the API.
    operator = server.run("token")
    assert operator.returncode == 0, operator.stderr
    events = httpx.get(
        f"{server.url}/v1/audit/events",
        headers={"Authorization": f"Bearer {operator.stdout.strip()}"},
        params={"limit": 100},
        timeout=10,
    )
    assert events.status_code == 200, events.text
    cli_rows = [e for e in events.json()["items"] if e["method"] == "CLI"]
    actions = [(e["action"], e["status"]) for e in reversed(cli_rows)]
    # The operation's declared success status, as REST answers it (201 for a creation).
    assert actions == [
        ("tenant.create", 201),
        ("tenant.list", 200),
        ("tenant.disable", 200),
        ("tenant.enable", 200),
        ("tenant.disable", 400),
        ("tenant.disable", 409),
    ]
    [disable] = [e for e in cli_rows if (e["action"], e["status"]) == ("tenant.disable", 200)]
    assert disable["target_ids"] == [tenant_id]

    # The server and its database kept running throughout.
    server.assert_serving()
    assert postmaster is not None
    assert _postmaster_pid(server.data_dir) == postmaster
    assert _alive(postmaster)
    os.killpg(server.process.pid if server.process else 0, signal.SIGINT)
    assert server.wait() == 0
