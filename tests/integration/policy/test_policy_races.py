"""Policy changes of one tenant at the same time: serialised, never deadlocked (red-team: ten
concurrent principal creations answered nine 500s)."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field

import httpx
from sqlalchemy import text

from service.db.tenancy import name_tenant
from service.policy.compile import lock_policy, recompile
from tests.conftest import PUBLIC_URL
from tests.fixtures.api import Agent, Api


async def test_concurrent_creations_all_succeed_and_all_get_their_grants(api: Api) -> None:
    headers = api.admin.headers
    # The test client answers one request at a time; this transport really interleaves them.
    transport = httpx.ASGITransport(app=api.http.app)
    async with httpx.AsyncClient(transport=transport, base_url=PUBLIC_URL) as http:
        principals = [
            http.post("/v1/principals", json={"display_name": f"p{n}"}, headers=headers)
            for n in range(10)
        ]
        spaces = [
            http.post("/v1/spaces", json={"name": f"s{n}"}, headers=headers) for n in range(6)
        ]
        answers = await asyncio.gather(*principals, *spaces)
    assert [answer.status_code for answer in answers] == [201] * 16, [a.text for a in answers]
    for answer in answers[:10]:
        created = answer.json()
        explained = await api.http.get(
            f"/v1/principals/{created['id']}/permissions", headers=headers
        )
        spaces_granted = {p["space_id"] for p in explained.json()["permissions"]}
        assert spaces_granted == {created["personal_space_id"]}


async def test_seeding_and_scoped_rebuilds_equal_a_full_compile(api: Api) -> None:
    """New principals get their three personal grants without recompiling the tenant, and a
    membership or grant change rebuilds only the principals that reach its subject (a full
    compile per change made onboarding quadratic); the result must equal a full compile."""
    headers = api.admin.headers
    team = (await api.http.post("/v1/teams", json={"name": "t"}, headers=headers)).json()
    space = (await api.http.post("/v1/spaces", json={"name": "s"}, headers=headers)).json()
    await api.http.put(
        f"/v1/spaces/{space['space']['id']}/grants/read/{team['subject']}", headers=headers
    )
    for n in range(3):
        agent = await api.new_agent(f"a{n}")
        await api.http.put(f"/v1/teams/{team['id']}/members/{agent.principal_id}", headers=headers)
    late = await api.new_agent("late")  # seeded after the team rules exist
    # Scoped rebuilds (membership, grants, revokes) and a sub-space (a full rebuild).
    await api.http.put(f"/v1/teams/{team['id']}/members/{late.principal_id}", headers=headers)
    child = await api.http.post(
        "/v1/spaces", json={"name": "c", "parent_id": space["space"]["id"]}, headers=headers
    )
    assert child.status_code == 201, child.text
    await api.http.put(
        f"/v1/spaces/{space['space']['id']}/grants/write/user:{late.principal_id}",
        headers=headers,
    )
    await api.http.delete(f"/v1/teams/{team['id']}/members/{agent.principal_id}", headers=headers)
    await api.http.delete(
        f"/v1/spaces/{space['space']['id']}/grants/read/{team['subject']}", headers=headers
    )
    await api.http.put(
        f"/v1/spaces/{space['space']['id']}/grants/read/{team['subject']}", headers=headers
    )
    tenant = uuid.UUID(api.tenant_id)
    query = text(
        "SELECT principal_id, action, space_id FROM space_grants WHERE tenant_id = :t "
        "ORDER BY 1, 2, 3"
    )
    async with api.runtime.sessionmaker.begin() as session:
        await name_tenant(session, uuid.UUID(api.tenant_id))  # row-level security
        seeded = (await session.execute(query, {"t": tenant})).all()
        await lock_policy(session, tenant)
        await recompile(session, tenant)
        compiled = (await session.execute(query, {"t": tenant})).all()
    assert seeded == compiled
    assert len(seeded) > 3 * 5


async def _compiled_rows(api: Api) -> tuple[int, int, int]:
    """(principal_roles, role_grants, space_grants) rows of the test tenant."""
    counts = []
    async with api.runtime.sessionmaker.begin() as session:
        await name_tenant(session, uuid.UUID(api.tenant_id))  # row-level security
        for table in ("principal_roles", "role_grants", "space_grants"):
            counted = await session.scalar(
                text(f"SELECT count(*) FROM {table} WHERE tenant_id = :t"),
                {"t": uuid.UUID(api.tenant_id)},
            )
            counts.append(int(counted or 0))
    return counts[0], counts[1], counts[2]


async def test_a_grant_to_a_team_writes_one_row_per_space_not_per_member(api: Api) -> None:
    """Grants are two closures joined at read time: granting a team of 12 read on a tree of
    4 spaces adds 4 compiled rows (one per space), though 48 (member, space) pairs gain read."""
    headers = api.admin.headers
    team = (await api.http.post("/v1/teams", json={"name": "t"}, headers=headers)).json()
    members = [await api.new_agent(f"m{n}") for n in range(12)]
    for member in members:
        await api.http.put(f"/v1/teams/{team['id']}/members/{member.principal_id}", headers=headers)
    root = (await api.http.post("/v1/spaces", json={"name": "root"}, headers=headers)).json()
    parent = root["space"]["id"]
    for n in range(3):
        child = await api.http.post(
            "/v1/spaces", json={"name": f"c{n}", "parent_id": parent}, headers=headers
        )
        parent = child.json()["space"]["id"]
    roles, grants, pairs = await _compiled_rows(api)
    granted = await api.http.put(
        f"/v1/spaces/{root['space']['id']}/grants/read/{team['subject']}", headers=headers
    )
    assert granted.status_code == 200, granted.text
    assert await _compiled_rows(api) == (roles, grants + 4, pairs + 12 * 4)
    # And every member can now list the deepest space's memories (the join is what is read).
    writer = await api.http.put(
        f"/v1/spaces/{parent}/grants/write/{team['subject']}", headers=headers
    )
    assert writer.status_code == 200, writer.text
    await api.remember(members[0], key="deep", value="in the deepest space", space_id=parent)
    for member in members:
        listed = await api.http.get(
            "/v1/memories", params={"space_id": parent}, headers=member.headers
        )
        assert [item["value"] for item in listed.json()["items"]] == ["in the deepest space"]


async def test_two_admins_removing_each_other_at_once_leave_one_admin(api: Api) -> None:
    """Review item 3: the admin check ran before the policy lock, so both removals passed it
    and the tenant was left with no policy admin (5 of 5 rounds)."""
    every_admin_scope = ["manage:policy", "read:audit", "manage:erasure", "run:jobs"]
    transport = httpx.ASGITransport(app=api.http.app)
    for round_ in range(5):
        admins = []
        for n in range(2):
            principal = await api.new_principal(f"admin{round_}-{n}")
            client = await api.new_client(
                principal["id"], [*every_admin_scope, "manage:tenant"], kind="admin"
            )
            token = await api.access_token(client["client"]["client_id"], client["client_secret"])
            added = await api.http.put(
                f"/v1/roles/policy_admin/members/{principal['id']}", headers=api.admin.headers
            )
            assert added.status_code == 200, added.text
            admins.append((principal["id"], {"Authorization": f"Bearer {token}"}))
        (first, first_headers), (second, second_headers) = admins
        # Only the two of them hold the role now (the owner leaves it for this round).
        await api.http.delete(
            f"/v1/roles/policy_admin/members/{api.admin.principal_id}", headers=first_headers
        )
        async with httpx.AsyncClient(transport=transport, base_url=PUBLIC_URL) as http:
            answers = await asyncio.gather(
                http.delete(f"/v1/roles/policy_admin/members/{second}", headers=first_headers),
                http.delete(f"/v1/roles/policy_admin/members/{first}", headers=second_headers),
            )
        statuses = sorted(answer.status_code for answer in answers)
        assert statuses == [200, 403], [answer.text for answer in answers]
        refused = next(answer for answer in answers if answer.status_code == 403)
        assert refused.json()["type"].endswith("/policy-admin-required")
        async with api.runtime.sessionmaker.begin() as session:
            await name_tenant(session, uuid.UUID(api.tenant_id))  # row-level security
            holders = (
                (
                    await session.execute(
                        text(
                            "SELECT v0 FROM casbin_rule WHERE tenant_id = :t AND ptype = 'g' "
                            "AND v1 = 'role:policy_admin'"
                        ),
                        {"t": uuid.UUID(api.tenant_id)},
                    )
                )
                .scalars()
                .all()
            )
        assert len(holders) == 1, holders
        survivor = first_headers if holders == [f"user:{first}"] else second_headers
        # The survivor gives the owner its role back for the next round.
        back = await api.http.put(
            f"/v1/roles/policy_admin/members/{api.admin.principal_id}", headers=survivor
        )
        assert back.status_code == 200, back.text
        await api.http.delete(
            f"/v1/roles/policy_admin/members/{first if survivor is first_headers else second}",
            headers=api.admin.headers,
        )


@dataclass
class RevokeRace:
    """One round: a reader reading while an admin revokes its read grant."""

    http: httpx.AsyncClient
    reader: Agent
    space_id: str
    written: set[str]
    revoked_at: float | None = None
    reads: list[tuple[float, set[str]]] = field(default_factory=list)
    """(when the call began, the space's memories it showed)."""

    def reads_after_the_revoke(self) -> list[set[str]]:
        return [
            shown
            for began, shown in self.reads
            if self.revoked_at is not None and began > self.revoked_at
        ]

    async def read(self) -> None:
        """Search, list and get in turn until 9 calls began after the revoke answered."""
        loop = asyncio.get_running_loop()
        one = min(self.written)
        n = 0
        while len(self.reads_after_the_revoke()) < 9:
            began, n = loop.time(), n + 1
            if n % 3 == 0:
                answer = await self.http.post(
                    "/v1/memories/search",
                    json={"query": "launch plan"},
                    headers=self.reader.headers,
                )
                assert answer.status_code == 200, answer.text
                shown = {hit["memory"]["id"] for hit in answer.json()["hits"]}
            elif n % 3 == 1:
                answer = await self.http.get(
                    "/v1/memories", params={"space_id": self.space_id}, headers=self.reader.headers
                )
                # Not readable any more: the space answers like one that does not exist.
                assert answer.status_code in (200, 404), answer.text
                shown = {item["id"] for item in answer.json().get("items", [])}
            else:
                answer = await self.http.get(f"/v1/memories/{one}", headers=self.reader.headers)
                assert answer.status_code in (200, 404), answer.text
                shown = {one} if answer.status_code == 200 else set()
            self.reads.append((began, shown & self.written))

    async def revoke(self, grant: str, admin: dict[str, str], delay: float) -> None:
        await asyncio.sleep(delay)
        gone = await self.http.delete(grant, headers=admin)
        assert gone.status_code == 200, gone.text
        self.revoked_at = asyncio.get_running_loop().time()


async def test_no_read_after_a_revoke_commits_returns_what_it_revoked(api: Api) -> None:
    """Issue 18, concurrency: a reader searches, lists and gets while an admin takes its read
    grant away. Every call that began after the revoke's answer arrived (the change had
    committed) shows none of the space's memories; calls before it did, so the race was real."""
    headers = api.admin.headers
    space = await api.http.post(
        "/v1/spaces", json={"name": "revoked", "kind": "team"}, headers=headers
    )
    space_id = space.json()["space"]["id"]
    writer, reader = await api.new_agent("writer"), await api.new_agent("reader")
    for action in ("read", "write"):
        granted = await api.http.put(
            f"/v1/spaces/{space_id}/grants/{action}/user:{writer.principal_id}", headers=headers
        )
        assert granted.status_code == 200, granted.text
    written = {
        (
            await api.remember(
                writer, key=f"plan-{n}", value=f"the launch plan, part {n}", space_id=space_id
            )
        )["id"]
        for n in range(3)
    }
    grant = f"/v1/spaces/{space_id}/grants/read/user:{reader.principal_id}"
    transport = httpx.ASGITransport(app=api.http.app)
    seen_before = 0
    for round_ in range(5):
        assert (await api.http.put(grant, headers=headers)).status_code == 200
        async with httpx.AsyncClient(transport=transport, base_url=PUBLIC_URL) as http:
            race = RevokeRace(http, reader, space_id, written)
            await asyncio.gather(race.read(), race.revoke(grant, headers, 0.01 * round_))
        assert not [shown for shown in race.reads_after_the_revoke() if shown], round_
        seen_before += sum(1 for began, shown in race.reads if shown)
    assert seen_before, "no read overlapped a revoke: the test raced nothing"
