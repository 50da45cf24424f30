"""One role system: `auditor` is a Casbin role like `policy_admin`, and both guards read the
compiled role closure (`principal_roles`), one lookup per call, no walk over the rules. Grants
and removals count from the very next request, through teams too, and the tenant never loses
its last auditor, however the role reaches it."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import httpx
from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.db.session import create_sessionmaker
from service.policy.compile import lock_policy, recompile
from tests.conftest import PUBLIC_URL
from tests.fixtures.api import Agent, Api
from tests.integration.memory.support import assert_problem

AUDIT = "/v1/audit/events"
TEAMS = "/v1/teams"


async def _officer(api: Api, name: str = "officer") -> Agent:
    """A user with an admin client holding read:audit and manage:policy, and no role."""
    principal = await api.new_principal(name)
    client = await api.new_client(principal["id"], ["read:audit", "manage:policy"], kind="admin")
    token = await api.access_token(client["client"]["client_id"], client["client_secret"])
    return Agent(principal["id"], client["client"]["client_id"], client["client_secret"], token)


async def _as_owner(engine: AsyncEngine, tenant: str, sql: str, **params: Any) -> None:
    """Write what the API cannot (a team in a role, a bare closure row) as the tables' owner;
    `compile` in params rebuilds the tenant's closures afterwards, as a policy change does."""
    compile_after = params.pop("compile", False)
    async with create_sessionmaker(engine).begin() as session:
        await session.execute(text(sql), {"tenant": tenant, **params})
        if compile_after:
            await lock_policy(session, uuid.UUID(tenant))
            await recompile(session, uuid.UUID(tenant))


async def _rows(engine: AsyncEngine, sql: str, **params: Any) -> list[tuple[Any, ...]]:
    async with engine.connect() as conn:
        return [tuple(row) for row in await conn.execute(text(sql), params)]


_LINE = (
    "INSERT INTO casbin_rule (tenant_id, ptype, v0, v1, v2) "
    "VALUES (CAST(:tenant AS uuid), 'g', :member, :role, :tenant)"
)


async def _both(api: Api, who: Agent) -> tuple[int, int]:
    audit = await api.http.get(AUDIT, headers=who.headers)
    teams = await api.http.get(TEAMS, headers=who.headers)
    return audit.status_code, teams.status_code


async def test_the_auditor_role_is_a_compiled_casbin_line(
    api: Api, owner_engine: AsyncEngine
) -> None:
    officer = await _officer(api)
    member = f"user:{officer.principal_id}"
    version = "SELECT policy_version FROM tenants WHERE tenant_id = CAST(:t AS uuid)"
    line = "SELECT v2 FROM casbin_rule WHERE ptype = 'g' AND v0 = :m AND v1 = 'role:auditor'"
    closure = (
        "SELECT role FROM principal_roles WHERE principal_id = CAST(:p AS uuid) "
        "AND role = 'role:auditor'"
    )
    [(before,)] = await _rows(owner_engine, version, t=api.tenant_id)
    path = f"/v1/principals/{officer.principal_id}/roles/auditor"
    granted = await api.http.put(path, headers=api.admin.headers)
    assert granted.json() == {"principal_id": officer.principal_id, "role": "auditor"}
    assert await _rows(owner_engine, line, m=member) == [(api.tenant_id,)]
    assert await _rows(owner_engine, closure, p=officer.principal_id) == [("role:auditor",)]
    [(after,)] = await _rows(owner_engine, version, t=api.tenant_id)
    assert after == before + 1  # a role is policy: versioned like every membership
    assert (await api.http.get(AUDIT, headers=officer.headers)).status_code == 200

    assert (await api.http.delete(path, headers=api.admin.headers)).status_code == 204
    assert await _rows(owner_engine, line, m=member) == []
    assert await _rows(owner_engine, closure, p=officer.principal_id) == []
    assert_problem(await api.http.get(AUDIT, headers=officer.headers), 403, "auditor-role-required")


async def test_both_roles_reach_through_a_team_and_leave_with_it(
    api: Api, owner_engine: AsyncEngine
) -> None:
    officer = await _officer(api)
    assert await _both(api, officer) == (403, 403)
    team = await api.http.post(TEAMS, json={"name": "governance"}, headers=api.admin.headers)
    team_id = team.json()["id"]
    added = await api.http.put(
        f"/v1/teams/{team_id}/members/{officer.principal_id}", headers=api.admin.headers
    )
    assert added.status_code == 200, added.text
    # The API puts principals, not teams, in roles; pycasbin allows a team in a role, and so
    # does the compiler (the next test's property test compares the two).
    for role in ("role:auditor", "role:policy_admin"):
        await _as_owner(
            owner_engine, api.tenant_id, _LINE, member=f"team:{team_id}", role=role, compile=True
        )
    assert await _both(api, officer) == (200, 200)
    removed = await api.http.delete(
        f"/v1/teams/{team_id}/members/{officer.principal_id}", headers=api.admin.headers
    )
    assert removed.status_code == 200, removed.text
    assert_problem(await api.http.get(AUDIT, headers=officer.headers), 403, "auditor-role-required")
    assert_problem(await api.http.get(TEAMS, headers=officer.headers), 403, "policy-admin-required")


async def test_the_guards_read_the_compiled_closure_not_the_rules(
    api: Api, owner_engine: AsyncEngine
) -> None:
    """A closure row without its rule is honoured, a rule nobody compiled is not: the guards
    answer what the compiler wrote (in the request's snapshot), never a walk of their own."""
    compiled_only, rule_only = await _officer(api, "compiled"), await _officer(api, "rule")
    for role in ("role:auditor", "role:policy_admin"):
        await _as_owner(
            owner_engine,
            api.tenant_id,
            "INSERT INTO principal_roles (tenant_id, principal_id, role) "
            "VALUES (:tenant, :principal, :role)",
            principal=compiled_only.principal_id,
            role=role,
        )
        await _as_owner(
            owner_engine, api.tenant_id, _LINE, member=f"user:{rule_only.principal_id}", role=role
        )
    assert await _both(api, compiled_only) == (200, 200)
    assert await _both(api, rule_only) == (403, 403)


async def test_the_last_auditor_stays_however_the_role_reaches_it(
    api: Api, owner_engine: AsyncEngine
) -> None:
    officer = await _officer(api)
    team_id = (await api.http.post(TEAMS, json={"name": "t"}, headers=api.admin.headers)).json()[
        "id"
    ]
    await api.http.put(
        f"/v1/teams/{team_id}/members/{officer.principal_id}", headers=api.admin.headers
    )
    await _as_owner(
        owner_engine,
        api.tenant_id,
        _LINE,
        member=f"team:{team_id}",
        role="role:auditor",
        compile=True,
    )
    owner = api.admin.principal_id
    # The officer audits through the team, so the owner's own role may go.
    gone = await api.http.delete(f"/v1/principals/{owner}/roles/auditor", headers=api.admin.headers)
    assert gone.status_code == 204, gone.text
    assert_problem(
        await api.http.get(AUDIT, headers=api.admin.headers), 403, "auditor-role-required"
    )
    # Taking the officer out of the team would leave nobody to read the log: refused, unchanged.
    refused = await api.http.delete(
        f"/v1/teams/{team_id}/members/{officer.principal_id}", headers=api.admin.headers
    )
    body = assert_problem(refused, 409, "last-role-holder")
    assert "auditor" in body["detail"]
    assert (await api.http.get(AUDIT, headers=officer.headers)).status_code == 200
    members = await _rows(
        owner_engine,
        "SELECT count(*) FROM casbin_rule WHERE ptype = 'g' AND v0 = :m AND v1 = :team",
        m=f"user:{officer.principal_id}",
        team=f"team:{team_id}",
    )
    assert members == [(1,)]


@contextmanager
def _statements(engine: AsyncEngine) -> Iterator[list[str]]:
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        seen.append(statement)

    event.listen(engine.sync_engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", record)


def _role_reads(statements: Sequence[str]) -> list[str]:
    """Statements that read who holds a role: the closure, the raw rules, the old table."""
    names = ("principal_roles", "casbin_rule", "role_assignments")
    return [sql for sql in statements if any(name in sql for name in names)]


async def test_an_admin_or_audit_call_checks_its_role_with_one_lookup(api: Api) -> None:
    """Before: the policy-admin guard read the caller's principal row and walked `casbin_rule`
    with a recursive CTE on every admin call (2 statements), the auditor check read a table of
    its own. After: one primary-key lookup in the compiled closure, for either role."""
    for path in (TEAMS, AUDIT):
        assert (await api.http.get(path, headers=api.admin.headers)).status_code == 200
        with _statements(api.runtime.engine) as seen:
            answer = await api.http.get(path, headers=api.admin.headers)
        assert answer.status_code == 200, answer.text
        [lookup] = _role_reads(seen)
        assert "principal_roles" in lookup, lookup
        assert "RECURSIVE" not in lookup.upper()
        assert not any("RECURSIVE" in sql.upper() for sql in seen), path


async def test_two_auditors_removing_each_other_at_once_leave_one(
    api: Api, owner_engine: AsyncEngine
) -> None:
    """Both removals pass the guards before the tenant's policy lock; under it the second one
    sees the first committed and is refused 409, so the log keeps a reader (the race
    security.md said had no test of its own)."""
    every_admin_scope = ["manage:policy", "read:audit", "manage:erasure", "run:jobs"]
    transport = httpx.ASGITransport(app=api.http.app)
    owner_role = f"/v1/principals/{api.admin.principal_id}/roles/auditor"
    for round_ in range(3):
        auditors = []
        for n in range(2):
            principal = await api.new_principal(f"auditor{round_}-{n}")
            client = await api.new_client(
                principal["id"], [*every_admin_scope, "manage:tenant"], kind="admin"
            )
            token = await api.access_token(client["client"]["client_id"], client["client_secret"])
            for path in (
                f"/v1/roles/policy_admin/members/{principal['id']}",
                f"/v1/principals/{principal['id']}/roles/auditor",
            ):
                assert (await api.http.put(path, headers=api.admin.headers)).status_code == 200
            auditors.append((principal["id"], {"Authorization": f"Bearer {token}"}))
        (first, first_headers), (second, second_headers) = auditors
        assert (await api.http.delete(owner_role, headers=api.admin.headers)).status_code == 204
        async with httpx.AsyncClient(transport=transport, base_url=PUBLIC_URL) as http:
            answers = await asyncio.gather(
                http.delete(f"/v1/principals/{second}/roles/auditor", headers=first_headers),
                http.delete(f"/v1/principals/{first}/roles/auditor", headers=second_headers),
            )
        assert sorted(a.status_code for a in answers) == [204, 409], [a.text for a in answers]
        refused = next(a for a in answers if a.status_code == 409)
        assert refused.json()["type"].endswith("/last-role-holder")
        holders = await _rows(
            owner_engine,
            "SELECT principal_id::text FROM principal_roles "
            "WHERE tenant_id = CAST(:t AS uuid) AND role = 'role:auditor'",
            t=api.tenant_id,
        )
        assert len(holders) == 1, holders
        [(survivor,)] = holders
        assert survivor in {first, second}
        headers = first_headers if survivor == first else second_headers
        assert (await api.http.put(owner_role, headers=headers)).status_code == 200
        # Only the owner audits again when the next round starts.
        gone = await api.http.delete(
            f"/v1/principals/{survivor}/roles/auditor", headers=api.admin.headers
        )
        assert gone.status_code == 204, gone.text
