"""The tenant lifecycle through the API: create (its admin works at once), list, get, update,
disable (biting on the very next request), enable, and delete (a plan first, then retired)."""

from __future__ import annotations

import uuid
from typing import Any

from tests.fixtures.api import Agent, Api
from tests.integration.memory.support import as_owner, assert_problem
from tests.integration.tenants.support import platform


async def _audit_rows(api: Api, chain: str, action: str) -> list[Any]:
    async with as_owner(api.runtime) as conn:
        rows = await conn.exec_driver_sql(
            "SELECT target_ids, decision, status FROM audit_events "
            "WHERE tenant_id = %(chain)s AND action = %(action)s ORDER BY seq",
            {"chain": uuid.UUID(chain), "action": action},
        )
        return [tuple(row) for row in rows]


async def test_one_call_onboards_a_tenant_whose_admin_works_at_once(api: Api) -> None:
    admin = await platform(api)
    response = await admin.http.post(
        "/v1/tenants",
        json={"name": "initech", "settings": {"max_k": 20}},
        headers=admin.admin.headers,
    )
    assert response.status_code == 201, response.text
    assert response.headers["cache-control"] == "no-store"
    body = response.json()
    tenant = body["tenant"]
    assert (tenant["name"], tenant["is_platform"], tenant["disabled_at"]) == (
        "initech",
        False,
        None,
    )
    assert tenant["settings"] == {"max_k": 20}  # only what was set; the rest is the default
    assert body["admin"]["client_secret"].startswith("mgs_")
    # Its admin gets a token, makes an agent, and the agent remembers and recalls.
    new = Api(
        api.http,
        api.runtime,
        tenant["tenant_id"],
        Agent(body["admin"]["principal_id"], body["admin"]["client_id"], "", ""),
    )
    new.admin.secret = body["admin"]["client_secret"]
    new.admin.token = await new.access_token(new.admin.client_id, new.admin.secret)
    agent = await new.new_agent("worker")
    written = await new.remember(agent, key="deploy.window", value="deploys happen on friday")
    hits = (await new.search(agent, "when do we deploy", k=3)).json()["hits"]
    assert [hit["memory"]["id"] for hit in hits] == [written["id"]]
    # Audited in the platform chain, naming the new tenant.
    rows = await _audit_rows(api, admin.tenant_id, "tenant.create")
    assert rows[-1] == ([uuid.UUID(tenant["tenant_id"])], "allow", 201)
    # The new tenant's chain holds its own calls, not the platform's.
    assert await _audit_rows(api, tenant["tenant_id"], "tenant.create") == []


async def test_list_is_cursor_paginated_and_get_reads_one(api: Api) -> None:
    admin = await platform(api)
    made = {api.tenant_id, admin.tenant_id}
    for name in ("one", "two", "three"):
        made.add((await api.other_tenant(name)).tenant_id)
    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 2}
        if cursor:
            params["cursor"] = cursor
        page = await admin.http.get("/v1/tenants", params=params, headers=admin.admin.headers)
        assert page.status_code == 200, page.text
        items = page.json()["items"]
        assert len(items) <= 2
        seen += [item["tenant_id"] for item in items]
        pages += 1
        cursor = page.json()["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(made)
    assert pages == 3
    one = await admin.http.get(f"/v1/tenants/{api.tenant_id}", headers=admin.admin.headers)
    assert one.json()["name"] == "acme"
    assert one.json()["is_platform"] is False
    bad = await admin.http.get(
        "/v1/tenants", params={"cursor": "junk"}, headers=admin.admin.headers
    )
    assert_problem(bad, 400, "bad-cursor")


async def test_update_merges_settings_and_refuses_bad_ones_changing_nothing(api: Api) -> None:
    admin = await platform(api)
    path = f"/v1/tenants/{api.tenant_id}"
    first = await admin.http.patch(
        path, json={"settings": {"max_k": 3}}, headers=admin.admin.headers
    )
    assert first.status_code == 200, first.text
    second = await admin.http.patch(
        path,
        json={"name": "acme corp", "settings": {"default_ttl_seconds": 60}},
        headers=admin.admin.headers,
    )
    assert second.json()["name"] == "acme corp"
    assert second.json()["settings"] == {
        "max_k": 3,
        "default_ttl_seconds": 60,
    }
    before = (await admin.http.get(path, headers=admin.admin.headers)).json()
    cases = [
        ({"max_k": 1000}, "settings.max_k", "1..100"),
        ({"score_floor": 1.5}, "settings.score_floor", "0..1"),
        ({"search_exact_max_rows": -1}, "settings.search_exact_max_rows", "0..20000"),
        ({"no_such_thing": 1}, "settings.no_such_thing", None),
        ({"max_k": "three"}, "settings.max_k", "an integer"),
    ]
    for change, field, allowed in cases:
        response = await admin.http.patch(
            path, json={"settings": change}, headers=admin.admin.headers
        )
        problem = assert_problem(response, 422, "tenant-settings-invalid")
        assert problem["field"] == field, problem
        if allowed is not None:
            assert problem["allowed"] == allowed
            assert allowed in problem["detail"]
        else:
            assert "max_k" in problem["allowed"]  # the settings there are
    assert (await admin.http.get(path, headers=admin.admin.headers)).json() == before
    # A null resets a key to the operator's default.
    reset = await admin.http.patch(
        path, json={"settings": {"max_k": None}}, headers=admin.admin.headers
    )
    assert "max_k" not in reset.json()["settings"]


async def test_the_platform_tenant_cannot_be_disabled_or_deleted(api: Api) -> None:
    admin = await platform(api)
    for method, path in (
        ("POST", f"/v1/tenants/{admin.tenant_id}/disable"),
        ("DELETE", f"/v1/tenants/{admin.tenant_id}"),
    ):
        response = await admin.http.request(method, path, headers=admin.admin.headers)
        assert_problem(response, 409, "platform-tenant-locked")
    assert (await admin.http.get("/v1/tenants", headers=admin.admin.headers)).status_code == 200


async def test_delete_plans_first_then_retires_keeping_the_audit_chain(api: Api) -> None:
    admin = await platform(api)
    agent = await api.new_agent("alice")
    await api.remember(agent, key="a", value="one")
    await api.remember(agent, key="b", value="two")
    path = f"/v1/tenants/{api.tenant_id}"
    plan = (await admin.http.delete(path, headers=admin.admin.headers)).json()
    assert plan["disabled"] is False
    assert plan["confirm"] is None
    assert plan["deleted"] is False
    assert plan["removes"]["memories"] == 2
    assert plan["removes"]["principals"] == 2
    assert plan["removes"]["clients"] == 2
    assert plan["removes"]["audit_rows"] > 0
    # Nothing changed: the agent still works.
    assert (await api.search(agent, "one")).status_code == 200
    await admin.http.post(f"{path}/disable", headers=admin.admin.headers)
    plan = (await admin.http.delete(path, headers=admin.admin.headers)).json()
    assert plan["disabled"] is True
    assert plan["confirm"]
    for wrong in ("0.abc", plan["confirm"][:-2] + "xx", "junk"):
        refused = await admin.http.delete(
            path, params={"confirm": wrong}, headers=admin.admin.headers
        )
        assert_problem(refused, 422, "deletion-confirmation-invalid")
    # Another tenant's plan value does not delete this one.
    other = await api.other_tenant()
    await admin.http.post(f"/v1/tenants/{other.tenant_id}/disable", headers=admin.admin.headers)
    other_plan = (
        await admin.http.delete(f"/v1/tenants/{other.tenant_id}", headers=admin.admin.headers)
    ).json()
    crossed = await admin.http.delete(
        path, params={"confirm": other_plan["confirm"]}, headers=admin.admin.headers
    )
    assert_problem(crossed, 422, "deletion-confirmation-invalid")
    done = await admin.http.delete(
        path, params={"confirm": plan["confirm"]}, headers=admin.admin.headers
    )
    assert done.status_code == 200, done.text
    assert done.json()["deleted"] is True
    async with as_owner(api.runtime) as conn:
        left = await conn.exec_driver_sql(
            "SELECT (SELECT count(*) FROM memories WHERE tenant_id = %(t)s),"
            " (SELECT count(*) FROM principals WHERE tenant_id = %(t)s),"
            " (SELECT count(*) FROM clients WHERE tenant_id = %(t)s),"
            " (SELECT count(*) FROM audit_events WHERE tenant_id = %(t)s),"
            " (SELECT retired_at IS NOT NULL FROM tenants WHERE tenant_id = %(t)s),"
            " (SELECT count(*) FROM principals WHERE tenant_id = %(o)s)",
            {"t": uuid.UUID(api.tenant_id), "o": uuid.UUID(other.tenant_id)},
        )
        memories, principals, clients, audit, retired, others = tuple(left.one())
    assert (memories, principals, clients, retired) == (0, 0, 0, True)
    assert audit == plan["removes"]["audit_rows"]  # the chain stays
    assert_problem(await admin.http.get(path, headers=admin.admin.headers), 404, "tenant-not-found")
    refused = await api.token_response(api.admin.client_id, api.admin.secret)
    assert refused.status_code == 401
    # The other tenant (disabled, not deleted) is all there.
    assert others == 1  # its admin
    assert (
        await admin.http.get(f"/v1/tenants/{other.tenant_id}", headers=admin.admin.headers)
    ).status_code == 200


async def test_a_confirmation_does_not_outlive_the_disabling_it_was_asked_under(
    api: Api,
) -> None:
    """Red-team finding: a plan's value from before the tenant was enabled and disabled again
    carried out the later deletion (its counts had not changed)."""
    admin = await platform(api)
    path = f"/v1/tenants/{api.tenant_id}"
    await admin.http.post(f"{path}/disable", headers=admin.admin.headers)
    old = (await admin.http.delete(path, headers=admin.admin.headers)).json()["confirm"]
    await admin.http.post(f"{path}/enable", headers=admin.admin.headers)
    await admin.http.post(f"{path}/disable", headers=admin.admin.headers)
    replayed = await admin.http.delete(path, params={"confirm": old}, headers=admin.admin.headers)
    assert_problem(replayed, 422, "deletion-confirmation-invalid")
    assert (await admin.http.get(path, headers=admin.admin.headers)).status_code == 200


async def test_a_retired_tenant_leaves_nothing_but_its_audit_chain_and_row(api: Api) -> None:
    """Red-team finding: its IdP registrations (the pair stayed taken for ever) and its quota
    rows outlived it. Every table with a tenant_id holds nothing of it afterwards but its audit
    chain (append-only, content-free) and its retired `tenants` row."""
    admin = await platform(api)
    agent = await api.new_agent("alice")
    await api.remember(agent, key="a", value="one")
    pair = {"issuer": "https://login.acme.example/realms/acme", "audience": "memgate-acme"}
    registered = await api.http.post(
        "/v1/issuers",
        json={**pair, "jwks_url": "https://login.acme.example/realms/acme/certs"},
        headers=api.admin.headers,
    )
    assert registered.status_code == 201, registered.text
    path = f"/v1/tenants/{api.tenant_id}"
    limited = await admin.http.put(
        f"{path}/limits", json={"requests_per_second": 50}, headers=admin.admin.headers
    )
    assert limited.status_code == 200, limited.text
    await admin.http.post(f"{path}/disable", headers=admin.admin.headers)
    plan = (await admin.http.delete(path, headers=admin.admin.headers)).json()
    done = await admin.http.delete(
        path, params={"confirm": plan["confirm"]}, headers=admin.admin.headers
    )
    assert done.status_code == 200, done.text
    async with as_owner(api.runtime) as conn:
        tables = (
            (
                await conn.exec_driver_sql(
                    "SELECT DISTINCT c.table_name FROM information_schema.columns c"
                    " JOIN information_schema.tables t USING (table_schema, table_name)"
                    " WHERE c.column_name = 'tenant_id' AND c.table_schema = 'public'"
                    " AND t.table_type = 'BASE TABLE'"
                )
            )
            .scalars()
            .all()
        )
        left = {}
        for table in tables:
            count = await conn.exec_driver_sql(
                f"SELECT count(*) FROM {table} WHERE tenant_id = %(t)s",
                {"t": uuid.UUID(api.tenant_id)},
            )
            if (n := count.scalar_one()) > 0:
                left[table] = n
    # The chain's own tables (rows, head, checkpoints) stay; its actor map and pseudonym key
    # go with the tenant (issue 16: a tenant's deletion is an erasure), so nothing resolves.
    chain = {"audit_events", "audit_heads", "audit_checkpoints"}
    kept = {table for table in left if not table.startswith("audit_events_")}  # partitions
    assert kept <= {"tenants", *chain}, left
    # The pair is free again: another tenant may register it.
    other = await api.other_tenant()
    again = await other.http.post(
        "/v1/issuers",
        json={**pair, "jwks_url": "https://login.acme.example/realms/acme/certs"},
        headers=other.admin.headers,
    )
    assert again.status_code == 201, again.text
