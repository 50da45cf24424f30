"""Per-tenant settings that act today bite on the tenant's next request (they are read in the
entrance statement), tighten only that tenant, and never widen the operator's limits."""

from __future__ import annotations

from datetime import datetime

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from service.settings import MemorySettings
from service.tenants.settings import TenantSettings, effective_limits
from tests.fixtures.api import Agent, Api
from tests.integration.memory.support import assert_problem
from tests.integration.tenants.support import platform


async def _configure(api: Api, **settings: object) -> None:
    admin = await platform(api)
    response = await admin.http.patch(
        f"/v1/tenants/{api.tenant_id}", json={"settings": settings}, headers=admin.admin.headers
    )
    assert response.status_code == 200, response.text


async def test_max_k_and_page_size_bite_for_the_tenant_only(api: Api) -> None:
    other = await api.other_tenant()
    alice, carol = await api.new_agent("alice"), await other.new_agent("carol")
    for agent, tenant in ((alice, api), (carol, other)):
        await tenant.remember(agent, key="k1", value="first note")
    await _configure(api, max_k=3, max_page_size=2)
    # The same token as before: the settings are read on its next request.
    refused = await api.search(alice, "note", k=5)
    problem = assert_problem(refused, 422, "k-out-of-range")
    assert problem["max_k"] == 3
    assert "between 1 and 3" in problem["detail"]
    assert (await api.search(alice, "note", k=3)).status_code == 200
    page = await api.http.get("/v1/memories", params={"limit": 5}, headers=alice.headers)
    assert_problem(page, 422, "invalid-request")
    assert "between 1 and 2" in page.json()["detail"]
    # Another tenant keeps the operator's limits.
    assert (await other.search(carol, "note", k=5)).status_code == 200
    listed = await other.http.get("/v1/memories", params={"limit": 5}, headers=carol.headers)
    assert listed.status_code == 200, listed.text


async def test_default_ttl_applies_to_writes_that_give_none(api: Api) -> None:
    alice = await api.new_agent("alice")
    before = await api.remember(alice, key="before", value="kept forever")
    assert before["expires_at"] is None
    await _configure(api, default_ttl_seconds=120)
    defaulted = await api.remember(alice, key="after", value="expires by default")
    own = await api.remember(alice, key="own", value="own ttl", ttl_seconds=10)
    recorded = datetime.fromisoformat(defaulted["provenance"]["recorded_at"])
    expires = datetime.fromisoformat(defaulted["expires_at"])
    assert (expires - recorded).total_seconds() == 120
    own_span = datetime.fromisoformat(own["expires_at"]) - datetime.fromisoformat(
        own["provenance"]["recorded_at"]
    )
    assert own_span.total_seconds() == 10


async def test_exact_search_limit_sends_the_tenant_to_the_index(
    api: Api, span_exporter: InMemorySpanExporter
) -> None:
    alice = await api.new_agent("alice")
    for i in range(3):
        await api.remember(alice, key=f"k{i}", value=f"note number {i}")

    async def strategy() -> str:
        span_exporter.clear()
        assert (await api.search(alice, "note", k=2)).status_code == 200
        [rank] = [s for s in span_exporter.get_finished_spans() if s.name == "memory.rank"]
        assert rank.attributes is not None
        return str(rank.attributes["memgate.search.strategy"])

    assert await strategy() == "exact"  # 3 rows, under the operator's 20000
    await _configure(api, search_exact_max_rows=0)
    assert await strategy() == "approximate"


def test_tenant_settings_tighten_and_never_widen() -> None:
    operator = MemorySettings(max_k=50, max_page_size=40, exact_search_max_rows=100)
    tight = effective_limits(
        operator,
        TenantSettings(
            max_k=5,
            max_page_size=7,
            search_exact_max_rows=9,
            ann_ef_search=20,
            default_ttl_seconds=30,
        ),
    )
    assert (tight.max_k, tight.default_k, tight.max_page_size) == (5, 5, 7)
    assert (tight.exact_search_max_rows, tight.ann_ef_search, tight.default_ttl_seconds) == (
        9,
        20,
        30,
    )
    # A stored value above the operator's (the operator lowered a limit since) does not widen.
    wide = effective_limits(operator, TenantSettings(max_k=500, ann_ef_search=999))
    assert (wide.max_k, wide.ann_ef_search) == (50, operator.ann_ef_search)
    assert effective_limits(operator, TenantSettings()) == operator


async def test_agents_may_read_policy_off_refuses_registration_and_the_read(api: Api) -> None:
    early = await api.new_principal("early", kind="agent")
    created = await api.new_client(early["id"], ["read:memory", "read:policy"])
    client_id, secret = created["client"]["client_id"], created["client_secret"]
    before = Agent(early["id"], client_id, secret, await api.access_token(client_id, secret))
    path = f"/v1/principals/{before.principal_id}/permissions"
    assert (await api.http.get(path, headers=before.headers)).status_code == 200
    await _configure(api, agents_may_read_policy=False)
    # The agent registered earlier still holds the scope: its read is refused at the route.
    assert_problem(await api.http.get(path, headers=before.headers), 403, "agent-policy-read-off")
    # An admin (a user) still reads it.
    admin_read = await api.http.get(path, headers=api.admin.headers)
    assert admin_read.status_code == 200, admin_read.text
    # Registering, or re-enabling, an agent client with read:policy is refused.
    bot = await api.new_principal("late", kind="agent")
    body = {"principal_id": bot["id"], "name": "c", "scopes": ["read:memory", "read:policy"]}
    refused = await api.http.post("/v1/clients", json=body, headers=api.admin.headers)
    problem = assert_problem(refused, 422, "scope-not-allowed")
    assert "agents_may_read_policy" in problem["detail"]
    off = await api.http.post(f"/v1/clients/{before.client_id}/disable", headers=api.admin.headers)
    assert off.status_code == 200, off.text
    again = await api.http.post(f"/v1/clients/{before.client_id}/enable", headers=api.admin.headers)
    assert_problem(again, 422, "scope-not-allowed")
    # Without the scope the registration goes through.
    body["scopes"] = ["read:memory"]
    ok = await api.http.post("/v1/clients", json=body, headers=api.admin.headers)
    assert ok.status_code == 201, ok.text
