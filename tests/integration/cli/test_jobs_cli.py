"""`memgate jobs run` against a real running `serve`: the command attaches to the server's
embedded cluster (which keeps running), queues and runs the job as the tenant's job principal,
prints progress and the counts, and the API shows the run; platform jobs run on the same
command."""

from __future__ import annotations

import json
import re
import subprocess
import time
from typing import Any

import httpx

from tests.integration.cli.test_embedded_lifecycle import (
    COMMAND_TIMEOUT,
    MEMGATE,
    Server,
    _alive,
    _postmaster_pid,
    server,
)

__all__ = ["server"]  # the fixture, used by name

PROGRESS = re.compile(r"^memory\.sweep_expired run (\S+): batch (\d+) ", re.MULTILINE)
"""One progress line per batch a process ran: (run id, batch number)."""


def _api(server: Server, method: str, path: str, token: str, **kwargs: Any) -> httpx.Response:
    return httpx.request(
        method,
        f"{server.url}{path}",
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
        **kwargs,
    )


def test_jobs_run_sweeps_through_a_running_server(server: Server) -> None:
    server.env["MEMGATE_RETENTION_DAYS"] = "0"  # past expiry is past retention
    # As with CronJobs: serve's own worker is off, so the two processes below are the only
    # runners (on, it takes up a run still queued, and some batches would be its).
    server.env["MEMGATE_JOBS_POLL_SECONDS"] = "0"
    server.start()
    postmaster = _postmaster_pid(server.data_dir)
    token = server.run("token").stdout.strip()
    tenant = json.loads((server.data_dir / "admin-client.json").read_text())["tenant_id"]
    me = _api(server, "GET", "/v1/principals", token).json()["items"][0]["id"]
    space = _api(server, "POST", "/v1/spaces", token, json={"name": "ops", "kind": "team"})
    space_id = space.json()["space"]["id"]
    # A dry run (which the processes below do not join) names the tenant's job principal.
    queued = _api(
        server, "POST", "/v1/jobs/memory.sweep_expired/runs", token, json={"dry_run": True}
    )
    assert queued.status_code == 202, queued.text
    job = queued.json()["principal_id"]
    for subject, actions in (
        (f"user:{me}", ("read", "write")),
        (f"service:{job}", ("read", "delete")),
    ):
        for action in actions:
            granted = _api(server, "PUT", f"/v1/spaces/{space_id}/grants/{action}/{subject}", token)
            assert granted.status_code == 200, granted.text
    for key in ("a", "b", "c", "d", "e"):
        written = _api(
            server,
            "POST",
            "/v1/memories",
            token,
            json={
                "subject": "service:ops",
                "kind": "fact",
                "key": key,
                "value": f"short-lived {key}",
                "ttl_seconds": 1,
                "space_id": space_id,
                "new_key": True,
            },
        )
        assert written.status_code == 201, written.text
    time.sleep(1.5)

    # Two processes at once (two CronJob pods): whether the second joins the first's run or
    # queues one after it ended, every row is scanned and swept exactly once.
    server.env["MEMGATE_JOBS_BATCH_SIZE"] = "1"
    command = [*MEMGATE, "jobs", "run", "memory.sweep_expired", "--tenant", tenant]
    both = [
        subprocess.Popen(  # noqa: S603 (our own CLI)
            command, env=server.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outputs = [process.communicate(timeout=COMMAND_TIMEOUT) for process in both]
    assert [process.returncode for process in both] == [0, 0], outputs
    runs = {r["id"]: r for r in (json.loads(out)["runs"][0] for out, _ in outputs)}
    assert all(r["status"] == "finished" for r in runs.values())
    assert sum(r["counts"]["scanned"] for r in runs.values()) == 5
    assert sum(r["counts"]["retracted"] for r in runs.values()) == 5
    # Each batch of each run was reported (so run) by exactly one of the two processes.
    reported = [match.groups() for _, err in outputs for match in PROGRESS.finditer(err)]
    assert len(reported) == len(set(reported)) == sum(r["batches"] for r in runs.values())
    run = max(runs.values(), key=lambda r: r["counts"]["retracted"])
    assert run["principal_id"] == job
    assert run["enqueued_by"] is None
    shown = _api(server, "GET", f"/v1/jobs/runs/{run['id']}", token).json()
    assert (shown["status"], shown["counts"]) == ("finished", run["counts"])

    unknown = server.run("jobs", "run", "memory.everything")
    assert unknown.returncode == 1
    assert "memory.sweep_expired" in unknown.stderr
    assert "audit.checkpoint" in unknown.stderr

    signed = server.run("jobs", "run", "audit.checkpoint")
    assert signed.returncode == 0, signed.stderr
    assert json.loads(signed.stdout)["counts"]["signed"] >= 1

    rotated = server.run("jobs", "run", "keys.rotate")
    assert rotated.returncode == 0, rotated.stderr
    assert json.loads(rotated.stdout)["counts"] == {"rotated": 1}
    # A token signed before the rotation still works.
    assert _api(server, "GET", "/v1/jobs/runs", token).status_code == 200

    # The server and its database kept running throughout.
    assert postmaster is not None
    assert _alive(postmaster)
    assert _postmaster_pid(server.data_dir) == postmaster
    server.assert_serving()
