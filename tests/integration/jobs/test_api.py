"""The job runner API: its access table (401, 403, another tenant's 404), bad input that queues
nothing, and what a queued run says about itself."""

from __future__ import annotations

import uuid

import pytest

from service.jobs.principals import job_principal_id
from tests.fixtures.api import MEMORY_SCOPES, Api, TestClient
from tests.integration.jobs.support import queue, run_of, runner, start
from tests.integration.memory.support import assert_problem, scalar

JOB_ROUTES = (
    ("POST", "/v1/jobs/{id}/runs"),
    ("GET", "/v1/jobs/runs"),
    ("GET", "/v1/jobs/runs/{id}"),
)
"""Every route of the job API (tests/integration/test_route_access.py leaves them to this
table)."""
SWEEP = "memory.sweep_expired"


def _path(template: str, value: str) -> str:
    return template.replace("{id}", value)


async def _runs(api: Api) -> int:
    count: int = await scalar(api.runtime, "SELECT count(*) FROM job_runs")
    return count


@pytest.mark.parametrize(("method", "template"), JOB_ROUTES)
async def test_no_token_is_401(http: TestClient, method: str, template: str) -> None:
    path = _path(template, SWEEP if template.endswith("/runs") else str(uuid.uuid4()))
    for headers in ({}, {"Authorization": "Bearer not.a.jwt"}):
        response = await http.request(method, path, json={}, headers=headers)
        assert_problem(response, 401, "unauthenticated")
        assert response.headers["www-authenticate"].startswith("Bearer ")


@pytest.mark.parametrize(("method", "template"), JOB_ROUTES)
async def test_without_run_jobs_is_403_and_queues_nothing(
    api: Api, method: str, template: str
) -> None:
    agent = await api.new_agent("alice")
    asked = await api.token_response(agent.client_id, agent.secret, "run:jobs read:memory")
    assert asked.json()["scope"].split() == ["read:memory"]  # never issued to an agent
    narrowed = await api.access_token(
        api.admin.client_id, api.admin.secret, " ".join(MEMORY_SCOPES)
    )
    path = _path(template, SWEEP if template.endswith("/runs") else str(uuid.uuid4()))
    for token in (agent.token, asked.json()["access_token"], narrowed):
        response = await api.http.request(
            method, path, json={}, headers={"Authorization": f"Bearer {token}"}
        )
        problem = assert_problem(response, 403, "insufficient-scope")
        assert problem["required_scope"] == "run:jobs"
    assert await _runs(api) == 0


async def test_another_tenants_run_is_404_like_a_random_id(api: Api) -> None:
    other = await api.other_tenant()
    foreign = await queue(other, SWEEP, dry_run=True)
    fresh = str(uuid.uuid4())
    baseline = await api.http.get(f"/v1/jobs/runs/{fresh}", headers=api.admin.headers)
    assert_problem(baseline, 404, "job-run-not-found")
    response = await api.http.get(f"/v1/jobs/runs/{foreign}", headers=api.admin.headers)
    assert_problem(response, 404, "job-run-not-found")
    assert response.content.replace(str(foreign).encode(), b"{id}") == baseline.content.replace(
        fresh.encode(), b"{id}"
    )
    listed = await api.http.get("/v1/jobs/runs", headers=api.admin.headers)
    assert listed.json() == {"items": [], "next_cursor": None}
    assert (await run_of(other, foreign))["status"] == "queued"


async def test_unknown_job_is_404_naming_the_jobs(api: Api) -> None:
    response = await start(api, "memory.forget_everything")
    problem = assert_problem(response, 404, "unknown-job")
    assert "memory.sweep_expired" in problem["detail"]
    assert "memory.forget_everything" in problem["detail"]
    assert await _runs(api) == 0


@pytest.mark.parametrize(
    ("body", "status", "slug", "field"),
    [
        ({"space_id": "not-a-space"}, 400, "malformed-id", "space_id"),
        ({"space_id": str(uuid.uuid4())}, 404, "space-not-found", None),
        ({"options": {"subject": "service:search"}}, 422, "invalid-request", "options.subject"),
        ({"options": {"Bad Name": "x"}}, 422, "invalid-request", "options"),
        ({"options": {"subject": "x" * 201}}, 422, "invalid-request", "options"),
        ({"dry_run": "yes"}, 422, "invalid-request", "dry_run"),
        ({"everything": True}, 422, "invalid-request", "everything"),
    ],
)
async def test_bad_input_is_a_problem_and_queues_nothing(
    api: Api, body: dict[str, object], status: int, slug: str, field: str | None
) -> None:
    response = await start(api, SWEEP, **body)
    problem = assert_problem(response, status, slug)
    if field is not None:
        assert field in response.text, problem
    assert await _runs(api) == 0


async def test_a_queued_run_runs_as_the_job_principal_and_is_listed(api: Api) -> None:
    response = await start(api, SWEEP, dry_run=True)
    assert response.status_code == 202, response.text
    run = response.json()
    assert run["status"] == "queued"
    assert run["job"] == SWEEP
    assert run["dry_run"] is True
    assert run["principal_id"] == str(job_principal_id(uuid.UUID(api.tenant_id)))
    assert run["enqueued_by"] == api.admin.principal_id
    assert run["counts"] == {}
    second = await queue(api, SWEEP)
    listed = (await api.http.get("/v1/jobs/runs", headers=api.admin.headers)).json()
    assert [item["id"] for item in listed["items"]] == [str(second), run["id"]]
    queued = await api.http.get(
        "/v1/jobs/runs", params={"status": "queued"}, headers=api.admin.headers
    )
    assert len(queued.json()["items"]) == 2
    await runner(api).run(uuid.UUID(api.tenant_id), uuid.UUID(run["id"]))
    refused = await api.http.get(
        "/v1/jobs/runs", params={"status": "refused"}, headers=api.admin.headers
    )
    assert [item["id"] for item in refused.json()["items"]] == [run["id"]]
    assert refused.json()["items"][0]["error"]["slug"] == "job-grants-missing"
    bad = await api.http.get("/v1/jobs/runs", params={"cursor": "x"}, headers=api.admin.headers)
    assert_problem(bad, 400, "bad-cursor")
    bad_status = await api.http.get(
        "/v1/jobs/runs", params={"status": "sleeping"}, headers=api.admin.headers
    )
    assert_problem(bad_status, 422, "invalid-request")
    malformed = await api.http.get("/v1/jobs/runs/not-an-id", headers=api.admin.headers)
    assert_problem(malformed, 400, "malformed-id")


async def test_runs_are_listed_in_cursor_pages_newest_first(api: Api) -> None:
    # Each run ends before the next is queued: an identical pending run would be joined.
    queued = []
    for _ in range(53):
        run_id = await queue(api, SWEEP, dry_run=True)
        await runner(api).run(uuid.UUID(api.tenant_id), run_id)
        queued.append(str(run_id))
    first = (await api.http.get("/v1/jobs/runs", headers=api.admin.headers)).json()
    assert [item["id"] for item in first["items"]] == queued[::-1][:50]
    second = await api.http.get(
        "/v1/jobs/runs", params={"cursor": first["next_cursor"]}, headers=api.admin.headers
    )
    assert second.status_code == 200, second.text
    assert [item["id"] for item in second.json()["items"]] == queued[::-1][50:]
    assert second.json()["next_cursor"] is None
