"""History, stable version numbers, revert and the two timelines (issue 12).

`GET /v1/memories/{id}/history` walks a key's chain in one statement, each hop under Visible,
stopping at the first version the caller cannot see; DELETE retracts a version into a stub that
keeps its number; revert writes an earlier value again; reads take `as_of` / `known_at`."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy import text, update
from sqlalchemy.exc import DBAPIError

from service.db.models import Memory
from service.settings import MemorySettings, Settings
from tests.conftest import make_settings
from tests.fixtures.api import Agent, Api
from tests.fixtures.entrance import bypasses_visible
from tests.integration.audit.support import audit_rows
from tests.integration.memory.support import (
    as_owner,
    assert_problem,
    count_memories,
    memory_rows,
    random_id,
)

KEY = {"subject": "service:billing", "kind": "fact", "key": "deploy.window"}


@pytest.fixture
def settings(database_url: str, tmp_path: Path, request: pytest.FixtureRequest) -> Settings:
    limits = getattr(request, "param", MemorySettings())
    return replace(make_settings(database_url, tmp_path), memory=limits)


async def _history(api: Api, agent: Agent, memory_id: str, **params: Any) -> dict[str, Any]:
    response = await api.http.get(
        f"/v1/memories/{memory_id}/history", params=params, headers=agent.headers
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _versions(history: dict[str, Any]) -> list[int]:
    return [item["version"] for item in history["items"]]


async def _chain(api: Api, agent: Agent, n: int, **fields: Any) -> list[dict[str, Any]]:
    return [await api.remember(agent, **KEY, value=f"value {i}", **fields) for i in range(n)]


async def _shared_space(api: Api, grants: dict[str, tuple[str, ...]]) -> str:
    created = await api.http.post(
        "/v1/spaces", json={"name": f"team-{uuid.uuid4().hex[:8]}"}, headers=api.admin.headers
    )
    assert created.status_code == 201, created.text
    space_id: str = created.json()["space"]["id"]
    for principal_id, actions in grants.items():
        for action in actions:
            granted = await api.http.put(
                f"/v1/spaces/{space_id}/grants/{action}/user:{principal_id}",
                headers=api.admin.headers,
            )
            assert granted.status_code == 200, granted.text
    return space_id


# History ---------------------------------------------------------------------------------


async def test_history_is_the_chain_newest_first_from_any_version(api: Api) -> None:
    alice = await api.new_agent("alice")
    v1, v2, v3 = await _chain(api, alice, 3)
    for start in (v1, v2, v3):
        history = await _history(api, alice, start["id"])
        assert [i["id"] for i in history["items"]] == [v3["id"], v2["id"], v1["id"]]
        assert [i["value"] for i in history["items"]] == ["value 2", "value 1", "value 0"]
        assert [i["status"] for i in history["items"]] == ["live", "superseded", "superseded"]
        assert history["next_cursor"] is None
    items = (await _history(api, alice, v1["id"]))["items"]
    assert (items[0]["supersedes"], items[0]["superseded_by"]) == (v2["id"], None)
    assert (items[1]["supersedes"], items[1]["superseded_by"]) == (v1["id"], v3["id"])
    assert (items[2]["supersedes"], items[2]["superseded_by"]) == (None, v2["id"])
    # Another key of the same subject is another chain.
    other = await api.remember(alice, **(KEY | {"key": "oncall"}), value="alice")
    assert _versions(await _history(api, alice, other["id"])) == [1]


async def test_history_pages_back_with_a_cursor(api: Api) -> None:
    alice = await api.new_agent("alice")
    chain = await _chain(api, alice, 5)
    first = await _history(api, alice, chain[1]["id"], limit=2)
    assert _versions(first) == [5, 4]
    second = await _history(api, alice, chain[1]["id"], limit=2, cursor=first["next_cursor"])
    assert _versions(second) == [3, 2]
    third = await _history(api, alice, chain[1]["id"], limit=2, cursor=second["next_cursor"])
    assert (_versions(third), third["next_cursor"]) == ([1], None)
    exact = await _history(api, alice, chain[0]["id"], limit=5)
    assert (_versions(exact), exact["next_cursor"]) == ([5, 4, 3, 2, 1], None)
    bad = await api.http.get(
        f"/v1/memories/{chain[0]['id']}/history", params={"cursor": "nope"}, headers=alice.headers
    )
    assert_problem(bad, 400, "bad-cursor")
    too_many = await api.http.get(
        f"/v1/memories/{chain[0]['id']}/history", params={"limit": 101}, headers=alice.headers
    )
    assert "limit" in assert_problem(too_many, 422, "invalid-request")["detail"]


async def test_history_stops_at_an_expired_hop_never_skipping_it(api: Api) -> None:
    alice = await api.new_agent("alice")
    v1 = await api.remember(alice, **KEY, value="value 0")
    v2 = await api.remember(alice, **KEY, value="value 1", ttl_seconds=1)
    v3 = await api.remember(alice, **KEY, value="value 2")
    assert _versions(await _history(api, alice, v1["id"])) == [3, 2, 1]
    await asyncio.sleep(1.2)  # bounded: one TTL
    assert _versions(await _history(api, alice, v3["id"])) == [3]
    assert _versions(await _history(api, alice, v1["id"])) == [1]
    gone = await api.http.get(f"/v1/memories/{v2['id']}/history", headers=alice.headers)
    assert_problem(gone, 404, "memory-not-found")


async def test_history_stops_at_a_hop_in_an_audience_the_reader_is_not_in(
    api: Api, owner_engine: Any
) -> None:
    """A version whose `read_requires` names a space the reader cannot read (derived data of a
    narrower audience, planted by the owner since the write path keeps a key's audience) ends
    the reader's walk there; its writer, who can read that space, sees the whole chain."""
    alice = await api.new_agent("alice")
    bob = await api.new_agent("bob")
    space_id = await _shared_space(
        api, {alice.principal_id: ("read", "write"), bob.principal_id: ("read",)}
    )
    private = (await api.remember(alice, key="private", value="alice only"))["space_id"]
    v1, v2, v3 = [
        await api.remember(alice, **KEY, space_id=space_id, value=f"value {i}") for i in range(3)
    ]
    with bypasses_visible("test setup: a hop of a narrower audience"):
        async with owner_engine.begin() as conn:
            await conn.execute(
                update(Memory)
                .where(Memory.id == uuid.UUID(v2["id"]))
                .values(read_requires=[uuid.UUID(private)])
            )
    assert _versions(await _history(api, alice, v1["id"])) == [3, 2, 1]
    assert _versions(await _history(api, bob, v3["id"])) == [3]
    assert _versions(await _history(api, bob, v1["id"])) == [1]
    hidden = await api.http.get(f"/v1/memories/{v2['id']}/history", headers=bob.headers)
    got = await api.http.get(f"/v1/memories/{v2['id']}", headers=bob.headers)
    assert _without_instance(hidden) == _without_instance(got)
    # The reader who loses the space loses the history: the same 404 as any unseen id.
    revoked = await api.http.delete(
        f"/v1/spaces/{space_id}/grants/read/user:{bob.principal_id}", headers=api.admin.headers
    )
    assert revoked.status_code in {200, 204}, revoked.text
    lost = await api.http.get(f"/v1/memories/{v3['id']}/history", headers=bob.headers)
    assert_problem(lost, 404, "memory-not-found")


async def test_an_unseen_id_answers_the_404_of_get(api: Api) -> None:
    alice = await api.new_agent("alice")
    bob = await api.new_agent("bob")
    theirs = await api.remember(bob, **KEY, value="bob's")
    for memory_id in (theirs["id"], random_id()):
        history = await api.http.get(f"/v1/memories/{memory_id}/history", headers=alice.headers)
        get = await api.http.get(f"/v1/memories/{memory_id}", headers=alice.headers)
        assert_problem(history, 404, "memory-not-found")
        assert _without_instance(history) == _without_instance(get)


def _without_instance(response: Any) -> dict[str, Any]:
    """A problem's members but `instance` (the request path, which differs by route)."""
    body: dict[str, Any] = response.json()
    return {k: v for k, v in body.items() if k != "instance"}


# Stable numbers --------------------------------------------------------------------------


async def test_a_deleted_version_is_a_stub_and_its_number_is_never_issued_again(
    api: Api,
) -> None:
    alice = await api.new_agent("alice")
    v1, v2, v3 = await _chain(api, alice, 3)
    assert (
        await api.http.delete(f"/v1/memories/{v2['id']}", headers=alice.headers)
    ).status_code == 204
    v4 = await api.remember(alice, **KEY, value="value 3")
    assert (v4["version"], v4["supersedes"]) == (4, v3["id"])
    # Deleting the head: the key has no live value, and the next write still gets a new number.
    assert (
        await api.http.delete(f"/v1/memories/{v4['id']}", headers=alice.headers)
    ).status_code == 204
    assert (await api.http.get("/v1/memories", headers=alice.headers)).json()["items"] == []
    v5 = await api.remember(alice, **KEY, value="value 4")
    assert (v5["version"], v5["supersedes"]) == (5, v4["id"])
    history = await _history(api, alice, v1["id"])
    assert _versions(history) == [5, 4, 3, 2, 1]
    assert [i["status"] for i in history["items"]] == [
        "live",
        "retracted",
        "superseded",
        "retracted",
        "superseded",
    ]
    stubs = [i for i in history["items"] if i["status"] == "retracted"]
    assert [(s["value"], s["metadata"], s["provenance"]["source"]) for s in stubs] == [
        ("", {}, None),
        ("", {}, None),
    ]
    assert all(s["retracted_at"] is not None for s in stubs)
    # Stubs are shown by history only: not by get, list, counts or search; twice is a 404.
    assert_problem(
        await api.http.get(f"/v1/memories/{v2['id']}", headers=alice.headers),
        404,
        "memory-not-found",
    )
    assert_problem(
        await api.http.delete(f"/v1/memories/{v2['id']}", headers=alice.headers),
        404,
        "memory-not-found",
    )
    counts = await api.http.get("/v1/memories/counts", headers=alice.headers)
    assert counts.json()["total"] == 1
    found = await api.search(alice, "value 1", k=10)
    assert [h["memory"]["id"] for h in found.json()["hits"]] == [v5["id"]]
    rows = await memory_rows(api.runtime, "key = 'deploy.window'")
    assert [row["version"] for row in rows] == [1, 2, 3, 4, 5]
    assert len({row["version"] for row in rows}) == 5


async def test_a_stub_counts_for_nothing_in_the_storage_usage(api: Api) -> None:
    alice = await api.new_agent("alice")
    kept = await api.remember(alice, key="kept", value="kept value")
    doomed = await api.remember(alice, key="doomed", value="a value with some bytes in it")

    async def usage() -> tuple[int, int]:
        async with as_owner(api.runtime) as conn:
            row = (
                await conn.execute(
                    text(
                        "SELECT sum(stored_count), sum(stored_bytes) FROM tenant_usage "
                        "WHERE tenant_id = :t"
                    ),
                    {"t": api.tenant_id},
                )
            ).one()
            return int(row[0]), int(row[1])

    count_before, bytes_before = await usage()
    assert count_before == 2
    assert (
        await api.http.delete(f"/v1/memories/{doomed['id']}", headers=alice.headers)
    ).status_code == 204
    count_after, bytes_after = await usage()
    assert count_after == 1
    assert bytes_after == bytes_before - (
        len("service:billing") + len("doomed") + len(doomed["value"]) + len("{}")
    )
    assert await count_memories(api.runtime) == 2  # the stub row is still there
    assert kept["id"] != doomed["id"]


_NAME_CALLER = text(
    "SELECT set_config('memgate.tenant_id', :tenant, true), "
    "set_config('memgate.principal_id', :principal, true)"
)


async def _rls_update(
    api: Api, agent: Agent, memory_id: str, values: str, *, commit: bool = False
) -> Any:
    """An UPDATE as the app role with `agent` named, past Visible: row-level security alone
    decides (rolled back unless `commit`). Answers the ids updated, or the database's
    refusal (its SQLSTATE)."""
    with bypasses_visible("row-level security alone, in this test"):
        async with api.runtime.sessionmaker() as session, session.begin():
            await session.execute(
                _NAME_CALLER, {"tenant": api.tenant_id, "principal": agent.principal_id}
            )
            try:
                updated = await session.scalars(
                    text(f"UPDATE memories SET {values} WHERE id = :id RETURNING id"),
                    {"id": memory_id},
                )
                ids = [str(i) for i in updated.all()]
            except DBAPIError as exc:
                await session.rollback()
                return getattr(exc.orig, "sqlstate", None)
            if not commit:
                await session.rollback()
            return ids


async def test_a_deleter_without_write_can_only_leave_a_stub(api: Api) -> None:
    """Defense in depth under the API: the `memories_retract` policy lets a principal with
    delete but no write on a space turn a version into a content-free stub and nothing else."""
    alice = await api.new_agent("alice")
    janitor = await api.new_agent("janitor")
    space_id = await _shared_space(
        api, {alice.principal_id: ("read", "write"), janitor.principal_id: ("read", "delete")}
    )
    memory = await api.remember(alice, **KEY, space_id=space_id, value="deploys on tuesday")
    stub = (
        "retracted_at = now(), superseded_at = now(), value = '', embedding = NULL, "
        "content_hash = ''::bytea, metadata = '{}'::jsonb, source = NULL"
    )
    assert await _rls_update(api, janitor, memory["id"], stub) == [memory["id"]]
    forged = [
        "value = 'deploys on friday'",
        "retracted_at = now(), value = 'deploys on friday'",
        stub.replace("value = ''", "value = 'kept'"),
    ]
    for values in forged:
        assert await _rls_update(api, janitor, memory["id"], values) in ([], "42501"), values
    # The writer may still update (the ordinary write policy).
    assert await _rls_update(api, alice, memory["id"], "source = 'x'") == [memory["id"]]


_STUB = (
    "retracted_at = now(), superseded_at = now(), value = '', embedding = NULL, "
    "content_hash = ''::bytea, metadata = '{}'::jsonb, source = NULL"
)
"""The one change a deleter without write may make: the version becomes a closed stub."""


async def test_a_deleter_without_write_may_change_nothing_else_while_stubbing(
    api: Api,
) -> None:
    """Red-team (rt12 B): the stub's content columns were checked, every other column was
    free. Under the trigger of migration `retract_only_stubs` each is refused, and the row
    is exactly as it was."""
    alice = await api.new_agent("alice")
    janitor = await api.new_agent("janitor")
    team = await _shared_space(
        api, {alice.principal_id: ("read", "write"), janitor.principal_id: ("read", "delete")}
    )
    other = await _shared_space(api, {janitor.principal_id: ("read", "delete")})
    v1 = await api.remember(alice, **KEY, space_id=team, value="deploys on tuesday")
    v2 = await api.remember(alice, **KEY, space_id=team, value="deploys on wednesday")
    before = await memory_rows(api.runtime, "id = :id", id=v2["id"])
    besides = {
        "key and subject": "key = 'hijacked', subject = 'user:someone'",
        "space": f"space_id = '{other}'",
        "links": f"supersedes = NULL, superseded_by = '{v1['id']}'",
        "version": "version = 99",
        "writer and owner": (
            f"writer_id = '{janitor.principal_id}', owner_id = '{janitor.principal_id}'"
        ),
        "valid and recorded time": "valid_from = '2000-01-01Z', recorded_at = '2000-01-01Z'",
        "derived_from": f"derived_from = ARRAY['{v1['id']}']::uuid[]",
        "read_requires": f"read_requires = ARRAY['{team}']::uuid[]",
        "valid_until": "valid_until = now()",
        "expires_at": "expires_at = now() + interval '1 day'",
    }
    changed = {
        what: await _rls_update(api, janitor, v2["id"], f"{_STUB}, {extra}")
        for what, extra in besides.items()
    }
    back_dated = _STUB.replace("now()", "'2000-01-01Z'")
    changed["a back-dated retraction"] = await _rls_update(api, janitor, v2["id"], back_dated)
    assert {what: answer for what, answer in changed.items() if answer not in ([], "42501")} == {}
    assert await memory_rows(api.runtime, "id = :id", id=v2["id"]) == before
    # The stub alone still passes (the API's delete without write).
    assert await _rls_update(api, janitor, v2["id"], _STUB) == [v2["id"]]


async def test_a_deleter_cannot_leave_an_open_stub_that_jams_the_key(api: Api) -> None:
    """Red-team (rt12 B): a stub left with `superseded_at` NULL stayed in the live-key index,
    and the owner's next write of the key answered 500. Such a stub is refused; the writer's
    next version continues the chain."""
    alice = await api.new_agent("alice")
    janitor = await api.new_agent("janitor")
    team = await _shared_space(
        api, {alice.principal_id: ("read", "write"), janitor.principal_id: ("read", "delete")}
    )
    v1 = await api.remember(alice, **KEY, space_id=team, value="deploys on tuesday")
    open_stub = _STUB.replace("superseded_at = now(), ", "")
    assert await _rls_update(api, janitor, v1["id"], open_stub, commit=True) == "42501"
    [row] = await memory_rows(api.runtime, "id = :id", id=v1["id"])
    assert (row["value"], row["retracted_at"], row["superseded_at"]) == (
        "deploys on tuesday",
        None,
        None,
    )
    response = await api.http.post(
        "/v1/memories",
        json={**KEY, "space_id": team, "value": "deploys on friday"},
        headers=alice.headers,
    )
    assert response.status_code == 201, response.text
    written = response.json()
    assert (written["memory"]["version"], written["superseded"]) == (2, [v1["id"]])


async def test_delete_on_one_space_and_write_on_another_rewrite_nothing(api: Api) -> None:
    """Red-team (rt12 B): permissive policies are OR-ed, so the retract policy's USING (delete
    on B) and the write policy's WITH CHECK (write on A) let mallory rewrite alice's row of B
    with a value of her own and move it into A, keeping alice as its writer. And a writer of
    A with delete on C could move its row into C as a stub. Delete never lends write."""
    alice = await api.new_agent("alice")
    mallory = await api.new_agent("mallory")
    b = await _shared_space(
        api, {alice.principal_id: ("read", "write"), mallory.principal_id: ("read", "delete")}
    )
    a = await _shared_space(api, {mallory.principal_id: ("read", "write")})
    c = await _shared_space(api, {mallory.principal_id: ("read", "delete")})
    alices = await api.remember(alice, **KEY, space_id=b, value="deploys on tuesday")
    mallorys = await api.remember(
        mallory, **(KEY | {"key": "deploy.day"}), space_id=a, value="deploys on monday"
    )
    before = await memory_rows(api.runtime)
    moved = f"space_id = '{a}', value = 'alice says: wire money'"
    assert await _rls_update(api, mallory, alices["id"], moved, commit=True) in ([], "42501")
    assert await _rls_update(api, mallory, alices["id"], f"space_id = '{a}'") in ([], "42501")
    into_c = f"{_STUB}, space_id = '{c}'"
    assert await _rls_update(api, mallory, mallorys["id"], into_c, commit=True) in (
        [],
        "42501",
    )
    assert await memory_rows(api.runtime) == before
    seen = await api.http.get(f"/v1/memories/{alices['id']}", headers=alice.headers)
    assert (seen.json()["value"], seen.json()["space_id"]) == ("deploys on tuesday", b)
    # Her own write on A still works, and so does the stub of alice's row (delete on B).
    assert await _rls_update(api, mallory, mallorys["id"], "source = 'x'") == [mallorys["id"]]
    assert await _rls_update(api, mallory, alices["id"], _STUB) == [alices["id"]]


# Revert ----------------------------------------------------------------------------------


async def test_revert_writes_an_earlier_value_as_the_new_live_version(
    api: Api, owner_engine: Any
) -> None:
    alice = await api.new_agent("alice")
    tuesday = await api.remember(alice, **KEY, value="deploys on tuesday", source="runbook")
    wednesday = await api.remember(alice, **KEY, value="deploys on wednesday")
    response = await api.http.post(f"/v1/memories/{tuesday['id']}/revert", headers=alice.headers)
    assert response.status_code == 201, response.text
    written = response.json()
    again = written["memory"]
    assert written["superseded"] == [wednesday["id"]]
    assert (again["value"], again["version"], again["supersedes"], again["status"]) == (
        "deploys on tuesday",
        3,
        wednesday["id"],
        "live",
    )
    assert again["provenance"]["source"] == "runbook"
    assert again["id"] not in {tuesday["id"], wednesday["id"]}
    listed = (await api.http.get("/v1/memories", headers=alice.headers)).json()["items"]
    assert [m["id"] for m in listed] == [again["id"]]
    assert _versions(await _history(api, alice, tuesday["id"])) == [3, 2, 1]
    # One audit row, in the write's transaction, naming the old version, the new one and the
    # version it closed; no memory text.
    [row] = [r for r in await audit_rows(owner_engine) if r["action"] == "memory.revert"]
    assert (row["decision"], row["status"]) == ("allow", 201)
    assert {str(t) for t in row["target_ids"]} == {tuesday["id"], again["id"], wednesday["id"]}
    assert "tuesday" not in str(row)


async def test_revert_after_deleting_the_head_is_not_stopped_by_the_write_gate(
    api: Api,
) -> None:
    """Red-team (rt12 C): with the key's head deleted the key has no live value, so the
    write gate took the revert for a new key and answered an undeclared 409. A revert
    re-asserts a value of that very key: it passes, and continues the chain."""
    alice = await api.new_agent("alice")
    v1 = await api.remember(alice, **KEY, value="deploys on tuesday")
    v2 = await api.remember(alice, **KEY, value="deploys on wednesday")
    await api.remember(alice, subject=KEY["subject"], kind="fact", key="owner", value="billing")
    deleted = await api.http.delete(f"/v1/memories/{v2['id']}", headers=alice.headers)
    assert deleted.status_code == 204, deleted.text
    response = await api.http.post(f"/v1/memories/{v1['id']}/revert", headers=alice.headers)
    assert response.status_code == 201, response.text
    written = response.json()
    again = written["memory"]
    assert written["superseded"] == []
    assert (again["value"], again["version"], again["supersedes"]) == (
        "deploys on tuesday",
        3,
        v2["id"],
    )
    history = await _history(api, alice, v1["id"])
    assert [(i["version"], i["status"]) for i in history["items"]] == [
        (3, "live"),
        (2, "retracted"),
        (1, "superseded"),
    ]


async def test_reverting_a_retracted_stub_is_a_problem_and_changes_nothing(api: Api) -> None:
    alice = await api.new_agent("alice")
    v1, v2 = await _chain(api, alice, 2)
    assert (
        await api.http.delete(f"/v1/memories/{v1['id']}", headers=alice.headers)
    ).status_code == 204
    before = await memory_rows(api.runtime)
    response = await api.http.post(f"/v1/memories/{v1['id']}/revert", headers=alice.headers)
    problem = assert_problem(response, 409, "version-retracted")
    assert problem["version"] == 1
    assert "history" in problem["detail"]
    assert "Nothing was changed" in problem["detail"]
    assert await memory_rows(api.runtime) == before
    live = await api.http.get(f"/v1/memories/{v2['id']}", headers=alice.headers)
    assert live.json()["status"] == "live"


async def test_revert_needs_write_on_the_versions_space(api: Api) -> None:
    alice = await api.new_agent("alice")
    reader = await api.new_agent("reader")
    space_id = await _shared_space(
        api, {alice.principal_id: ("read", "write"), reader.principal_id: ("read",)}
    )
    v1 = await api.remember(alice, **KEY, space_id=space_id, value="value 0")
    await api.remember(alice, **KEY, space_id=space_id, value="value 1")
    before = await memory_rows(api.runtime)
    response = await api.http.post(f"/v1/memories/{v1['id']}/revert", headers=reader.headers)
    assert_problem(response, 403, "space-read-only")
    assert await memory_rows(api.runtime) == before


# Two timelines ---------------------------------------------------------------------------

JAN = "2026-01-01T00:00:00Z"
MID_JAN = "2026-01-15T00:00:00Z"
FEB = "2026-02-01T00:00:00Z"
MID_FEB = "2026-02-15T00:00:00Z"


async def _dated(api: Api, alice: Agent) -> dict[str, dict[str, Any]]:
    """v1 "tuesday" valid from January, v2 "wednesday" valid from February (recorded after v1),
    then v1 reverted: v3 "tuesday" again, valid from its writing."""
    v1 = await api.remember(alice, **KEY, value="deploys on tuesday", valid_from=JAN)
    v2 = await api.remember(alice, **KEY, value="deploys on wednesday", valid_from=FEB)
    reverted = await api.http.post(f"/v1/memories/{v1['id']}/revert", headers=alice.headers)
    assert reverted.status_code == 201, reverted.text
    return {"v1": v1, "v2": v2, "v3": reverted.json()["memory"]}


async def _listed(api: Api, agent: Agent, **params: str) -> list[str]:
    response = await api.http.get("/v1/memories", params=params, headers=agent.headers)
    assert response.status_code == 200, response.text
    return [item["id"] for item in response.json()["items"]]


async def _searched(
    api: Api, agent: Agent, fields: dict[str, Any] | None = None, k: int = 5
) -> list[str]:
    response = await api.search(agent, "when do deploys happen", k=k, **(fields or {}))
    assert response.status_code == 200, response.text
    return [hit["memory"]["id"] for hit in response.json()["hits"]]


async def test_as_of_and_known_at_on_a_dated_history_with_a_revert(api: Api) -> None:
    alice = await api.new_agent("alice")
    v = await _dated(api, alice)
    v1, v2, v3 = v["v1"]["id"], v["v2"]["id"], v["v3"]["id"]
    recorded = {name: memory["provenance"]["recorded_at"] for name, memory in v.items()}
    cases: list[tuple[dict[str, str], list[str]]] = [
        ({}, [v3]),
        ({"as_of": MID_JAN}, [v1]),  # what was true in January
        ({"as_of": MID_FEB}, [v2]),  # February, before the revert
        ({"as_of": "2000-01-01T00:00:00Z"}, []),  # before anything: nothing was true
        ({"as_of": "2100-01-01T00:00:00Z"}, [v3]),  # the future: what holds from now on
        ({"known_at": recorded["v1"]}, [v1]),  # what we held when v1 was written
        ({"known_at": recorded["v2"]}, [v2]),
        ({"known_at": recorded["v3"]}, [v3]),
        ({"known_at": "2000-01-01T00:00:00Z"}, []),  # before anything was recorded
        ({"known_at": "2100-01-01T00:00:00Z"}, [v3]),  # nothing is recorded after now
        # Together: what we believed then about another time.
        ({"known_at": recorded["v2"], "as_of": MID_JAN}, [v1]),
        ({"known_at": recorded["v2"], "as_of": MID_FEB}, [v2]),
        ({"known_at": recorded["v1"], "as_of": MID_FEB}, [v1]),  # v1 was open-ended then
        ({"known_at": recorded["v1"], "as_of": "2025-06-01T00:00:00Z"}, []),
    ]
    for params, expected in cases:
        assert await _listed(api, alice, **params) == expected, params
        assert await _searched(api, alice, params) == expected, params
        counted = await api.http.get("/v1/memories/counts", params=params, headers=alice.headers)
        assert counted.json()["total"] == len(expected), params
    # get: the version only if it existed then (valid from then, and recorded by then).
    for memory_id, params, status in [
        (v1, {"as_of": MID_JAN}, 200),
        (v2, {"as_of": MID_JAN}, 404),
        (v3, {"known_at": recorded["v2"]}, 404),
        (v2, {"known_at": recorded["v2"]}, 200),
    ]:
        got = await api.http.get(f"/v1/memories/{memory_id}", params=params, headers=alice.headers)
        assert got.status_code == status, (memory_id, params, got.text)
    # history: the chain as it stood then (versions recorded, or valid from, by then).
    assert _versions(await _history(api, alice, v1, known_at=recorded["v2"])) == [2, 1]
    assert _versions(await _history(api, alice, v1, known_at=recorded["v1"])) == [1]
    assert _versions(await _history(api, alice, v1, as_of=MID_JAN)) == [1]
    assert _versions(await _history(api, alice, v1, as_of=MID_FEB)) == [2, 1]
    assert _versions(await _history(api, alice, v1)) == [3, 2, 1]
    unseen = await api.http.get(
        f"/v1/memories/{v3}/history", params={"known_at": recorded["v2"]}, headers=alice.headers
    )
    assert_problem(unseen, 404, "memory-not-found")


async def test_bad_timestamps_are_problems_that_name_the_field(api: Api) -> None:
    alice = await api.new_agent("alice")
    memory = await api.remember(alice, **KEY, value="deploys on tuesday")
    for params, field in [
        ({"as_of": "2026-01-01T00:00:00"}, "as_of"),  # no time zone
        ({"known_at": "2026-01-01T00:00:00"}, "known_at"),
        ({"as_of": "yesterday"}, "as_of"),
        ({"known_at": "2026-13-01T00:00:00Z"}, "known_at"),
    ]:
        for path in (
            "/v1/memories",
            f"/v1/memories/{memory['id']}",
            f"/v1/memories/{memory['id']}/history",
        ):
            response = await api.http.get(path, params=params, headers=alice.headers)
            problem = assert_problem(response, 422, "invalid-request")
            assert field in problem["detail"], (path, params, problem)
    bodies: list[tuple[dict[str, Any], str]] = [
        ({"as_of": "2026-01-01T00:00:00"}, "as_of"),
        ({"known_at": "soon"}, "known_at"),
        ({"as_of": 1767225600}, "as_of"),
    ]
    for body, field in bodies:
        response = await api.search(alice, "deploys", **body)
        problem = assert_problem(response, 422, "invalid-request")
        assert field in problem["detail"], (body, problem)


@pytest.mark.parametrize(
    "settings", [MemorySettings(exact_search_max_rows=0)], indirect=True, ids=["always-walk"]
)
async def test_a_time_travelling_search_takes_the_exact_path(
    api: Api, span_exporter: InMemorySpanExporter
) -> None:
    """The HNSW index holds live rows only: a search at another time must rank exactly, even
    where every live search walks the index."""
    alice = await api.new_agent("alice")
    v = await _dated(api, alice)
    span_exporter.clear()
    assert await _searched(api, alice, {"as_of": MID_FEB}, k=1) == [v["v2"]["id"]]
    [rank] = [s for s in span_exporter.get_finished_spans() if s.name == "memory.rank"]
    assert rank.attributes is not None
    assert rank.attributes["memgate.search.strategy"] == "exact"
    span_exporter.clear()
    assert await _searched(api, alice, k=1) == [v["v3"]["id"]]  # a walk that finds its k
    [rank] = [s for s in span_exporter.get_finished_spans() if s.name == "memory.rank"]
    assert rank.attributes is not None
    assert rank.attributes["memgate.search.strategy"] == "approximate"
