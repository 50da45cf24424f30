"""Red-team finding 3: disabling clients may never leave a tenant without a working policy
admin. Two admins disabling each other's admin clients at once both got 200, and the tenant's
only admin could disable its own client (its next token request was 401, and nothing in the
API could undo it)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
from sqlalchemy import text

from service.auth.scopes import ADMIN_SCOPES
from service.db.models import Principal
from service.db.tenancy import name_tenant
from service.policy.compile import lock_policy, recompile
from service.policy.rules import EXTERNAL_ADMIN, POLICY_ADMIN, Rule, add_rules, principal_name
from tests.conftest import PUBLIC_URL, TRUSTED_TEST_ISSUER
from tests.fixtures.api import Api
from tests.integration.memory.support import as_owner

EVERY_ADMIN_SCOPE = sorted(ADMIN_SCOPES)


async def _disabled_clients(api: Api) -> dict[str, bool]:
    """client id → disabled, read from the database (not from an answer)."""
    async with api.runtime.sessionmaker.begin() as session:
        await name_tenant(session, uuid.UUID(api.tenant_id))  # row-level security
        rows = await session.execute(
            text("SELECT client_id, disabled_at IS NOT NULL FROM clients WHERE tenant_id = :t"),
            {"t": uuid.UUID(api.tenant_id)},
        )
        return {str(client_id): bool(disabled) for client_id, disabled in rows.all()}


async def _admin(api: Api, name: str) -> tuple[str, str, str, dict[str, str]]:
    """A user in role:policy_admin with an admin client holding every admin scope:
    (principal id, client id, secret, headers)."""
    principal = await api.new_principal(name)
    created = await api.new_client(principal["id"], EVERY_ADMIN_SCOPE, kind="admin")
    client_id, secret = created["client"]["client_id"], created["client_secret"]
    added = await api.http.put(
        f"/v1/roles/policy_admin/members/{principal['id']}", headers=api.admin.headers
    )
    assert added.status_code == 200, added.text
    token = await api.access_token(client_id, secret)
    return principal["id"], client_id, secret, {"Authorization": f"Bearer {token}"}


WaitFor = Callable[[int], Awaitable[None]]


@asynccontextmanager
async def _policy_lock_held(api: Api) -> AsyncIterator[WaitFor]:
    """Hold the tenant's policy lock; yields a function that returns once `n` other backends
    wait for it. The lock is released on leaving."""
    tenant = uuid.UUID(api.tenant_id)
    async with api.runtime.sessionmaker.begin() as holder:
        await name_tenant(holder, tenant)  # row-level security
        await lock_policy(holder, tenant)

        async def waiting_for_it(n: int) -> None:
            # As the owner: the app role sees no other session's wait events.
            async with as_owner(api.runtime) as probe, asyncio.timeout(10):
                while True:
                    # The first waiter is blocked by the holder, the next ones by the first
                    # waiter's tuple lock: count every lock wait here.
                    blocked = await probe.scalar(
                        text(
                            "SELECT count(*) FROM pg_stat_activity WHERE"
                            " datname = current_database() AND wait_event_type = 'Lock'"
                        )
                    )
                    await probe.rollback()  # the next look sees a fresh snapshot
                    if (blocked or 0) >= n:
                        return
                    await asyncio.sleep(0.02)

        yield waiting_for_it


def _assert_last_admin_refusal(answer: httpx.Response, client_id: str) -> None:
    assert answer.status_code == 409, answer.text
    assert answer.headers["content-type"].startswith("application/problem+json")
    problem: dict[str, Any] = answer.json()
    assert problem["type"].endswith("/last-role-holder")
    assert client_id in problem["detail"]
    assert "nothing was changed" in problem["detail"].lower()


async def test_the_sole_admin_cannot_disable_its_own_client(api: Api) -> None:
    refused = await api.http.post(
        f"/v1/clients/{api.admin.client_id}/disable", headers=api.admin.headers
    )
    _assert_last_admin_refusal(refused, api.admin.client_id)
    assert (await _disabled_clients(api))[api.admin.client_id] is False
    # Its credentials still work: the live token and a new one.
    listed = await api.http.get("/v1/clients", headers=api.admin.headers)
    assert listed.status_code == 200, listed.text
    assert (await api.token_response(api.admin.client_id, api.admin.secret)).status_code == 200


async def test_policy_admins_without_a_working_admin_client_do_not_count(api: Api) -> None:
    """An agent, a user without clients, a user whose only admin client lacks manage:policy and
    a user whose admin client is disabled are all in role:policy_admin; none of them could
    manage access, so the owner's client is still the last one that can."""
    bot = await api.new_principal("bot", kind="agent")
    await api.new_client(bot["id"], ["read:memory"], kind="agent")
    bare = await api.new_principal("no-client")
    auditor = await api.new_principal("audit-only")
    await api.new_client(auditor["id"], ["read:audit"], kind="admin")
    stopped = await api.new_principal("stopped")
    stopped_client = await api.new_client(stopped["id"], EVERY_ADMIN_SCOPE, kind="admin")
    off = await api.http.post(
        f"/v1/clients/{stopped_client['client']['client_id']}/disable", headers=api.admin.headers
    )
    assert off.status_code == 200, off.text
    for member in (bot, bare, auditor, stopped):
        added = await api.http.put(
            f"/v1/roles/policy_admin/members/{member['id']}", headers=api.admin.headers
        )
        assert added.status_code == 200, added.text
    before = await _disabled_clients(api)
    refused = await api.http.post(
        f"/v1/clients/{api.admin.client_id}/disable", headers=api.admin.headers
    )
    _assert_last_admin_refusal(refused, api.admin.client_id)
    assert await _disabled_clients(api) == before


async def test_an_admin_may_disable_its_own_client_while_another_admin_works(api: Api) -> None:
    _, client_id, _, headers = await _admin(api, "second")
    done = await api.http.post(f"/v1/clients/{client_id}/disable", headers=headers)
    assert done.status_code == 200, done.text
    assert (await _disabled_clients(api))[client_id] is True
    # And the owner's client is now the last working one.
    refused = await api.http.post(
        f"/v1/clients/{api.admin.client_id}/disable", headers=api.admin.headers
    )
    _assert_last_admin_refusal(refused, api.admin.client_id)


async def test_two_admins_disabling_each_others_clients_at_once_leave_one_working(
    api: Api,
) -> None:
    """Several rounds of two concurrent real requests: exactly one disable goes through, the
    other is refused because its own client was disabled while it waited for the policy lock,
    and one admin can still get tokens and manage the tenant."""
    transport = httpx.ASGITransport(app=api.http.app)
    for round_ in range(5):
        (b_id, b_client, b_secret, b_headers), (c_id, c_client, c_secret, c_headers) = [
            await _admin(api, f"admin{round_}-{n}") for n in range(2)
        ]
        # Only B and C are policy admins for this round (the owner leaves the role).
        left = await api.http.delete(
            f"/v1/roles/policy_admin/members/{api.admin.principal_id}", headers=b_headers
        )
        assert left.status_code == 200, left.text
        async with (
            httpx.AsyncClient(transport=transport, base_url=PUBLIC_URL) as http,
            _policy_lock_held(api) as both_waiting,
        ):
            # Both requests pass authentication before either commits: the test holds the
            # tenant's policy lock until both wait for it, so the loser is refused by the
            # recheck under the lock (without it, a loser that arrives late is refused by
            # the entrance, which is right too but not what this test is about).
            calls = [
                asyncio.create_task(
                    http.post(f"/v1/clients/{c_client}/disable", headers=b_headers)
                ),
                asyncio.create_task(
                    http.post(f"/v1/clients/{b_client}/disable", headers=c_headers)
                ),
            ]
            await both_waiting(2)
        answers = await asyncio.gather(*calls)
        statuses = sorted(answer.status_code for answer in answers)
        assert statuses == [200, 401], [answer.text for answer in answers]
        refused = next(answer for answer in answers if answer.status_code == 401)
        assert refused.headers["content-type"].startswith("application/problem+json")
        assert "nothing was changed" in refused.json()["detail"].lower()
        disabled = await _disabled_clients(api)
        assert [disabled[b_client], disabled[c_client]].count(True) == 1, disabled
        survivor_id, survivor_client, survivor_secret = (
            (b_id, b_client, b_secret) if not disabled[b_client] else (c_id, c_client, c_secret)
        )
        loser_id = c_id if survivor_id == b_id else b_id
        # The survivor still works: a fresh token, and it gives the owner its role back.
        token = await api.access_token(survivor_client, survivor_secret)
        back = await api.http.put(
            f"/v1/roles/policy_admin/members/{api.admin.principal_id}",
            headers={"Authorization": f"Bearer {token}"},
        )
        assert back.status_code == 200, back.text
        for member in (survivor_id, loser_id):
            gone = await api.http.delete(
                f"/v1/roles/policy_admin/members/{member}", headers=api.admin.headers
            )
            assert gone.status_code == 200, gone.text


UNTRUSTED = "https://issuer-memgate-does-not-trust.invalid"


async def _principal_count(api: Api) -> int:
    async with api.runtime.sessionmaker.begin() as session:
        await name_tenant(session, uuid.UUID(api.tenant_id))  # row-level security
        found = await session.scalar(
            text("SELECT count(*) FROM principals WHERE tenant_id = :t"),
            {"t": uuid.UUID(api.tenant_id)},
        )
        return int(found or 0)


async def test_a_principal_of_an_untrusted_issuer_is_refused(api: Api) -> None:
    """Red-team pass 2, F3: the owner mapped a subject of an issuer memgate does not trust,
    approved it as an external admin and made it a policy admin; it then counted as a working
    admin, so the owner could disable its own last client. The mapping itself is refused."""
    before = await _principal_count(api)
    for fields in (
        {"external_issuer": UNTRUSTED, "external_subject": "nobody"},
        {"external_subject": "nobody"},  # no issuer at all: no token could ever match it
    ):
        answer = await api.http.post(
            "/v1/principals",
            json={"display_name": "ghost", "kind": "user", **fields},
            headers=api.admin.headers,
        )
        assert answer.status_code == 422, answer.text
        assert answer.headers["content-type"].startswith("application/problem+json")
        problem: dict[str, Any] = answer.json()
        assert problem["type"].endswith("/external-issuer-untrusted")
        assert "external_issuer" in problem["detail"]
        assert "1 " in problem["detail"]  # the test deployment trusts one external issuer
        assert UNTRUSTED not in problem["detail"]
    assert await _principal_count(api) == before


async def test_an_external_admin_of_an_issuer_no_longer_trusted_does_not_count(api: Api) -> None:
    """A mapping made while its issuer was trusted stays in the database when the issuer is
    taken out of MEMGATE_EXTERNAL_ISSUERS: nobody can log in as it any more, so neither its
    approval nor its policy admin role keeps the owner's last admin client disposable."""
    tenant = uuid.UUID(api.tenant_id)
    ghost = uuid.uuid4()
    async with api.runtime.sessionmaker.begin() as session:
        await name_tenant(session, tenant)  # row-level security
        session.add(
            Principal(
                tenant_id=tenant,
                id=ghost,
                kind="user",
                display_name="ghost",
                external_issuer=UNTRUSTED,
                external_subject="nobody",
            )
        )
        await session.flush()
        await lock_policy(session, tenant)
        name = principal_name("user", ghost)
        await add_rules(
            session, tenant, [Rule("g", name, EXTERNAL_ADMIN), Rule("g", name, POLICY_ADMIN)]
        )
        await recompile(session, tenant)
    # Nor can the approval be given (again) to such a mapping.
    approve = await api.http.put(
        f"/v1/roles/external_admin/members/{ghost}", headers=api.admin.headers
    )
    assert approve.status_code == 422, approve.text
    assert approve.json()["type"].endswith("/external-issuer-untrusted")
    refused = await api.http.post(
        f"/v1/clients/{api.admin.client_id}/disable", headers=api.admin.headers
    )
    _assert_last_admin_refusal(refused, api.admin.client_id)
    assert (await _disabled_clients(api))[api.admin.client_id] is False
    assert (await api.token_response(api.admin.client_id, api.admin.secret)).status_code == 200


async def test_an_approved_external_admin_of_a_trusted_issuer_still_counts(api: Api) -> None:
    """The external branch of the rule stands for a mapping whose IdP memgate trusts: its
    tokens can carry admin scopes, so the owner may disable its own client."""
    mapped = await api.new_principal(
        "idp admin", external_issuer=TRUSTED_TEST_ISSUER, external_subject="admin-1"
    )
    for role in ("external_admin", "policy_admin"):
        added = await api.http.put(
            f"/v1/roles/{role}/members/{mapped['id']}", headers=api.admin.headers
        )
        assert added.status_code == 200, added.text
    # The owner's client is also the tenant's only auditor credential: the mapping audits too.
    audits = await api.http.put(
        f"/v1/principals/{mapped['id']}/roles/auditor", headers=api.admin.headers
    )
    assert audits.status_code == 200, audits.text
    disabled = await api.http.post(
        f"/v1/clients/{api.admin.client_id}/disable", headers=api.admin.headers
    )
    assert disabled.status_code == 200, disabled.text
    assert (await _disabled_clients(api))[api.admin.client_id] is True
