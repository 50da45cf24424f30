"""The platform admin sets a tenant's quotas through `/v1/tenants/{id}/limits` (and a client's
through `/v1/tenants/{id}/clients/{client_id}/limits`); they bite on the replica that set them
at once, the answer shows what the tenant holds, and nobody else can set them: a tenant admin
cannot raise its own limits, another tenant's client is a 404 like an unknown one."""

from __future__ import annotations

import uuid

from tests.fixtures.api import Api
from tests.integration.memory.support import assert_problem
from tests.integration.tenants.support import platform

NOTE = {"subject": "service:billing", "kind": "fact", "key": "deploy.window", "value": "Tue"}


async def test_limits_set_through_the_api_bite_and_show_the_usage(api: Api) -> None:
    admin = await platform(api)
    alice = await api.new_agent("alice")
    assert (
        await api.http.post("/v1/memories", json=NOTE, headers=alice.headers)
    ).status_code == 201
    path = f"/v1/tenants/{api.tenant_id}/limits"
    set_ = await api.http.put(
        path,
        json={"requests_per_second": 0.001, "request_burst": 2, "max_memories": 10},
        headers=admin.admin.headers,
    )
    assert set_.status_code == 200, set_.text
    assert set_.json() == {"requests_per_second": 0.001, "request_burst": 2, "max_memories": 10}
    answers = [
        (await api.http.get("/v1/memories", headers=alice.headers)).status_code for _ in range(3)
    ]
    assert answers == [200, 200, 429]
    shown = await api.http.get(path, headers=admin.admin.headers)
    assert shown.status_code == 200, shown.text
    assert shown.json() == {
        "tenant": {"requests_per_second": 0.001, "request_burst": 2, "max_memories": 10},
        "clients": {},
        # What the row stores: subject, key, value and its empty metadata.
        "usage": {
            "memories": 1,
            "bytes": sum(len(NOTE[f]) for f in ("subject", "key", "value")) + 2,
        },
    }
    # An empty body removes them.
    cleared = await api.http.put(path, json={}, headers=admin.admin.headers)
    assert cleared.status_code == 200, cleared.text
    assert (await api.http.get("/v1/memories", headers=alice.headers)).status_code == 200


async def test_a_client_limit_names_a_client_of_that_tenant_only(api: Api) -> None:
    admin = await platform(api)
    other = await api.other_tenant()
    alice = await api.new_agent("alice")
    bob = await other.new_agent("bob")
    mine = f"/v1/tenants/{api.tenant_id}/clients/{alice.client_id}/limits"
    body = {"requests_per_second": 0.001, "request_burst": 1}
    assert (await api.http.put(mine, json=body, headers=admin.admin.headers)).status_code == 200
    assert [
        (await api.http.get("/v1/memories", headers=alice.headers)).status_code for _ in range(2)
    ] == [200, 429]
    foreign = await api.http.put(
        f"/v1/tenants/{api.tenant_id}/clients/{bob.client_id}/limits",
        json=body,
        headers=admin.admin.headers,
    )
    unknown = await api.http.put(
        f"/v1/tenants/{api.tenant_id}/clients/{uuid.uuid4()}/limits",
        json=body,
        headers=admin.admin.headers,
    )
    assert_problem(foreign, 404, "client-not-found")
    assert_problem(unknown, 404, "client-not-found")
    assert foreign.json()["detail"].replace(bob.client_id, "X") == unknown.json()["detail"].replace(
        unknown.request.url.path.split("/")[-2], "X"
    )
    # Bob was never limited.
    assert [
        (await other.http.get("/v1/memories", headers=bob.headers)).status_code for _ in range(3)
    ] == [200, 200, 200]
    shown = (
        await api.http.get(f"/v1/tenants/{api.tenant_id}/limits", headers=admin.admin.headers)
    ).json()
    assert shown["clients"] == {alice.client_id: body}


async def test_a_tenant_admin_cannot_set_or_read_limits(api: Api) -> None:
    for method, path in (
        ("PUT", f"/v1/tenants/{api.tenant_id}/limits"),
        ("GET", f"/v1/tenants/{api.tenant_id}/limits"),
    ):
        refused = await api.http.request(
            method, path, json={"requests_per_second": 1000}, headers=api.admin.headers
        )
        assert_problem(refused, 403, "platform-admin-required")


async def test_bad_limits_are_a_422_and_change_nothing(api: Api) -> None:
    admin = await platform(api)
    path = f"/v1/tenants/{api.tenant_id}/limits"
    for body in (
        {"requests_per_second": -1},
        # Red-team finding: a subnormal rate was stored, then every request failed with 422.
        {"requests_per_second": 5e-324},
        {"requests_per_second": 1e-300},
        {"request_burst": 3},
        {"colour": "red"},
    ):
        refused = await api.http.put(path, json=body, headers=admin.admin.headers)
        assert refused.status_code == 422, refused.text
        assert refused.headers["content-type"].startswith("application/problem+json")
    shown = (await api.http.get(path, headers=admin.admin.headers)).json()
    assert shown["tenant"] == {}


async def test_the_slowest_rate_answers_headers_a_client_can_read(api: Api) -> None:
    """At the slowest rate allowed, the 429's fields stay short integers (RFC 8941: at most
    15 digits) and `Retry-After` at most a day."""
    admin = await platform(api)
    alice = await api.new_agent("alice")
    path = f"/v1/tenants/{api.tenant_id}/limits"
    body = {"requests_per_second": 0.0001, "request_burst": 1}
    assert (await api.http.put(path, json=body, headers=admin.admin.headers)).status_code == 200
    assert (await api.http.get("/v1/memories", headers=alice.headers)).status_code == 200
    refused = await api.http.get("/v1/memories", headers=alice.headers)
    assert refused.status_code == 429, refused.text
    assert 1 <= int(refused.headers["retry-after"]) <= 86_400
    for name in ("ratelimit-policy", "ratelimit"):
        numbers = [part.split("=")[1] for part in refused.headers[name].split(";")[1:]]
        assert all(number.isdigit() and len(number) <= 15 for number in numbers), numbers
