"""The API through the typed client, against a real server: the memory operations and their
pages, problems as typed exceptions with their fields (401, 403, 404 across tenants, 409, 422),
spaces, teams and grants, audit, jobs and tenants; the sync client in a thread."""

from __future__ import annotations

import asyncio

import pytest
from memgate_client import (
    AsyncMemgate,
    ClientCredentials,
    InsufficientScope,
    InvalidClient,
    InvalidRequest,
    KeyChoiceRequired,
    Memgate,
    MemoryNotFound,
    NotFound,
    Unauthorized,
)
from memgate_client.errors import PROBLEM_BASE_URI

from tests.integration.client.conftest import QUICK, Tenant, new_tenant

SUBJECT = "service:billing"


async def test_memory_operations_and_their_pages(tenant: Tenant) -> None:
    agent = await tenant.agent("pages")
    async with tenant.client(agent.credentials()) as mg:
        written = [
            await mg.write_memory(
                subject=SUBJECT, kind="fact", key=f"fact.{i}", value=f"fact {i}", new_key=True
            )
            for i in range(5)
        ]
        ids = [w["memory"]["id"] for w in written]
        assert [m["id"] for m in [await mg.get_memory(i) for i in ids]] == ids

        first = await mg.list_memories(subject=SUBJECT, limit=2)
        assert len(first["items"]) == 2
        assert first["next_cursor"] is not None
        listed = [m["id"] async for m in mg.iter_memories(subject=SUBJECT, limit=2)]
        assert sorted(listed) == sorted(ids)  # three pages, each id once

        counts = await mg.count_memories(subject=SUBJECT, group_by="kind")
        assert counts["total"] == 5
        assert counts["groups"] == [{"value": "fact", "count": 5}]

        hits = (await mg.search_memories(query="fact 3", k=2, mode="lexical"))["hits"]
        assert hits[0]["memory"]["id"] == ids[3]

        newer = await mg.write_memory(subject=SUBJECT, kind="fact", key="fact.0", value="v2")
        assert newer["superseded"] == [ids[0]]
        chain = [m async for m in mg.iter_memory_history(newer["memory"]["id"], limit=1)]
        assert [(m["value"], m["status"]) for m in chain] == [
            ("v2", "live"),
            ("fact 0", "superseded"),
        ]
        reverted = await mg.revert_memory(ids[0])
        assert reverted["memory"]["value"] == "fact 0"
        assert reverted["superseded"] == [newer["memory"]["id"]]

        await mg.delete_memory(ids[1])
        with pytest.raises(MemoryNotFound) as raised:
            await mg.get_memory(ids[1])
        assert (await mg.count_memories(subject=SUBJECT))["total"] == 4
    problem = raised.value
    assert (problem.status, problem.slug, problem.title) == (
        404,
        "memory-not-found",
        "Memory not found",
    )
    assert problem.type == PROBLEM_BASE_URI + "memory-not-found"
    assert problem.detail


async def test_problems_arrive_as_typed_exceptions(
    tenant: Tenant, base_url: str, platform: ClientCredentials
) -> None:
    reader = await tenant.agent("reader", ["read:memory"])
    writer = await tenant.agent("writer")
    async with tenant.client(writer.credentials()) as mg:
        mine = await mg.write_memory(subject="service:gate", kind="fact", key="a", value="a")
        with pytest.raises(KeyChoiceRequired) as gate:
            await mg.write_memory(subject="service:gate", kind="fact", key="b", value="b")
        with pytest.raises(InvalidRequest) as invalid:
            await mg.write_memory(subject="service:gate", kind="fact", key="", value="b")
    assert [k["key"] for k in gate.value.keys] == ["a"]
    assert gate.value.status == 409
    assert invalid.value.errors
    assert invalid.value.status == 422

    async with tenant.client(reader.credentials()) as mg:
        with pytest.raises(InsufficientScope) as scope:
            await mg.write_memory(subject="service:x", kind="fact", key="k", value="v")
    assert scope.value.required_scope == "write:memory"
    assert "insufficient_scope" in scope.value.headers["www-authenticate"]

    async with AsyncMemgate(base_url, retry=QUICK) as anonymous:
        with pytest.raises(Unauthorized) as nobody:
            await anonymous.list_memories()
    assert nobody.value.slug == "unauthenticated"
    assert "resource_metadata" in nobody.value.headers["www-authenticate"]

    wrong = ClientCredentials(writer.created["client"]["client_id"], "not-the-secret")
    async with AsyncMemgate(base_url, credentials=wrong, retry=QUICK) as mg:
        with pytest.raises(InvalidClient) as refused:
            await mg.list_memories()
    assert (refused.value.status, refused.value.error) == (401, "invalid_client")

    # Another tenant's id answers exactly like an id that does not exist.
    other = await new_tenant(base_url, platform, "globex")
    stranger = await other.agent("stranger")
    async with other.client(stranger.credentials()) as mg:
        with pytest.raises(NotFound) as theirs:
            await mg.get_memory(mine["memory"]["id"])
        with pytest.raises(NotFound) as missing:
            await mg.get_memory("01a23456-0000-7000-8000-000000000000")
    assert type(theirs.value) is MemoryNotFound
    assert theirs.value.title == missing.value.title
    their_id = mine["memory"]["id"]
    assert theirs.value.detail.replace(their_id, "{id}") == missing.value.detail.replace(
        "01a23456-0000-7000-8000-000000000000", "{id}"
    )


async def test_spaces_teams_grants_audit_jobs_and_tenants(
    tenant: Tenant, base_url: str, platform: ClientCredentials
) -> None:
    member = await tenant.agent("member")
    async with tenant.client() as admin:
        team = await admin.create_team(name="billing")
        space = (await admin.create_space(name="billing-notes"))["space"]
        await admin.grant_space_access(space["id"], "read", team["subject"])
        await admin.add_team_member(team["id"], member.principal_id)
        access = await admin.get_space_access(space["id"], "read")
        assert member.principal_id in access["principal_ids"]
        assert team["id"] in [t["id"] for t in await admin.list_teams()]
        assert space["id"] in [s["id"] for s in await admin.list_spaces()]
        changed = await admin.remove_team_member(team["id"], member.principal_id)
        assert changed["policy_version"] > access["policy_version"]
        assert (
            member.principal_id
            not in (await admin.get_space_access(space["id"], "read"))["principal_ids"]
        )

        page = await admin.list_audit_events(limit=2)
        assert len(page["items"]) == 2
        events = [e async for e in admin.iter_audit_events(action="policy.grant", limit=1)]
        assert len(events) == 1
        assert events[0]["target_ids"]
        exported = await admin.export_audit_events(limit=3)
        assert [e["seq"] for e in exported["events"]] == [1, 2, 3]
        assert exported["next_seq"] == 4
        every = [e async for e in admin.iter_audit_export(limit=50)]
        assert [e["seq"] for e in every] == list(range(1, len(every) + 1))
        held = every[-1]  # a head we keep, as from an Audit-Receipt
        assert held["row_hash"] is not None
        verdict = await admin.verify_audit_chain(known_seq=held["seq"], known_hash=held["row_hash"])
        assert verdict["ok"] is True
        assert verdict["checked"] >= held["seq"]

        run = await admin.start_job_run("memory.sweep_expired", dry_run=True)
        assert (await admin.get_job_run(run["id"]))["status"] == "queued"
        assert run["id"] in [r["id"] async for r in admin.iter_job_runs()]

    async with AsyncMemgate(base_url, credentials=platform, retry=QUICK) as operator:
        names = [t["name"] async for t in operator.iter_tenants(limit=1)]
        assert (await operator.get_tenant(tenant.tenant_id))["name"] == "acme"
    assert {"platform", "acme"} <= set(names)


async def test_the_sync_client_in_a_thread(tenant: Tenant) -> None:
    """The same calls, blocking (in a thread: the server runs on this test's event loop)."""
    agent = await tenant.agent("sync")

    def calls() -> tuple[list[str], list[str], str]:
        with Memgate(tenant.base_url, credentials=agent.credentials(), retry=QUICK) as mg:
            ids = [
                mg.write_memory(
                    subject="service:sync", kind="fact", key=f"s.{i}", value="v", new_key=True
                )["memory"]["id"]
                for i in range(3)
            ]
            listed = [m["id"] for m in mg.iter_memories(subject="service:sync", limit=2)]
            mg.delete_memory(ids[0])
            with pytest.raises(MemoryNotFound) as gone:
                mg.get_memory(ids[0])
            return ids, listed, gone.value.slug

    ids, listed, slug = await asyncio.to_thread(calls)
    assert len(ids) == 3
    assert sorted(listed) == sorted(ids)
    assert slug == "memory-not-found"


async def test_audit_receipts_are_heads_the_log_is_held_to(tenant: Tenant) -> None:
    async with AsyncMemgate(
        tenant.base_url, credentials=tenant.admin, retry=QUICK, audit_receipts=True
    ) as admin:
        team = await admin.create_team(name="receipts")
        held = admin.last_receipt
        assert held is not None
        [row] = (await admin.export_audit_events(from_seq=held["seq"], limit=1))["events"]
        verdict = await admin.verify_audit_head()
        forged = await admin.verify_audit_head({"seq": held["seq"], "hash": "0" * 64})
    assert row["seq"] == held["seq"]
    assert row["row_hash"] == held["hash"]  # the receipt names the call's own row
    assert team["id"] in row["target_ids"]
    assert verdict["ok"] is True
    assert verdict["head_seq"] > held["seq"]  # the export and the verify were audited after
    assert (forged["ok"], forged["reason"], forged["first_bad_seq"]) == (
        False,
        "known_head_mismatch",
        held["seq"],
    )
