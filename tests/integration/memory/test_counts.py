"""GET /v1/memories/counts: how many live memories the caller can see, per kind, space or
subject. Counts cover exactly what list returns: superseded, expired, deleted and invisible rows
are not counted, and a space filter the caller cannot read is 404."""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.settings import MemorySettings, Settings
from tests.conftest import make_settings
from tests.fixtures.api import Agent, Api
from tests.integration.audit.support import audit_rows
from tests.integration.memory.support import as_owner, assert_problem

MAX_GROUPS = 3


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    """Small pages, so the group cap is reached with a handful of subjects."""
    return replace(
        make_settings(database_url, tmp_path), memory=MemorySettings(max_page_size=MAX_GROUPS)
    )


async def _counts(api: Api, agent: Agent, **params: Any) -> dict[str, Any]:
    response = await api.http.get("/v1/memories/counts", params=params, headers=agent.headers)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def _listed(api: Api, agent: Agent) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params = {"limit": MAX_GROUPS} | ({"cursor": cursor} if cursor else {})
        response = await api.http.get("/v1/memories", params=params, headers=agent.headers)
        page = response.json()
        items.extend(page["items"])
        cursor = page["next_cursor"]
        if cursor is None:
            return items


async def test_counts_equal_what_list_returns(api: Api) -> None:
    alice = await api.new_agent("alice")
    bob = await api.new_agent("bob")
    await api.remember(alice, key="a", kind="fact", value="one")
    await api.remember(alice, key="a", kind="fact", value="one, revised")  # supersedes
    await api.remember(alice, key="b", kind="preference", value="dark mode")
    expiring = await api.remember(alice, key="c", kind="decision", value="ship friday")
    deleted = await api.remember(alice, key="d", kind="decision", value="ship monday")
    await api.remember(alice, key="e", kind="decision", subject="user:alice", value="likes tea")
    await api.remember(bob, key="a", kind="fact", value="bob's own")
    async with as_owner(api.runtime) as conn:
        await conn.execute(
            text("UPDATE memories SET expires_at = now() - interval '1 second' WHERE id = :id"),
            {"id": expiring["id"]},
        )
        await conn.commit()
    gone = await api.http.delete(f"/v1/memories/{deleted['id']}", headers=alice.headers)
    assert gone.status_code == 204

    listed = await _listed(api, alice)
    assert len(listed) == 3
    plain = await _counts(api, alice)
    assert plain == {"total": 3, "group_by": None, "groups": [], "more_groups": False}
    by_kind = await _counts(api, alice, group_by="kind")
    assert by_kind["total"] == 3
    assert by_kind["groups"] == [
        {"value": "decision", "count": 1},
        {"value": "fact", "count": 1},
        {"value": "preference", "count": 1},
    ]
    assert Counter(item["kind"] for item in listed) == {
        group["value"]: group["count"] for group in by_kind["groups"]
    }
    by_subject = await _counts(api, alice, group_by="subject")
    assert by_subject["groups"] == [
        {"value": "service:billing", "count": 2},
        {"value": "user:alice", "count": 1},
    ]
    by_space = await _counts(api, alice, group_by="space")
    assert by_space["groups"] == [{"value": listed[0]["space_id"], "count": 3}]
    filtered = await _counts(api, alice, kind="decision", subject="user:alice")
    assert filtered["total"] == 1
    assert (await _counts(api, bob))["total"] == 1


async def test_a_counts_call_is_audited_with_its_total(api: Api, owner_engine: AsyncEngine) -> None:
    alice = await api.new_agent("alice")
    for n in range(3):
        await api.remember(alice, key=f"k{n}", value=f"note {n}")
    assert (await _counts(api, alice, group_by="kind"))["total"] == 3
    [row] = [r for r in await audit_rows(owner_engine) if r["action"] == "memory.count"]
    assert row["result_count"] == 3
    assert row["decision"] == "allow"


async def test_only_the_largest_groups_come_back_with_a_flag(api: Api) -> None:
    alice = await api.new_agent("alice")
    sizes = {"user:ann": 1, "user:ben": 3, "user:cat": 2, "user:dan": 2, "user:eve": 1}
    for subject, size in sizes.items():
        for n in range(size):
            await api.remember(alice, subject=subject, key=f"k{n}", value=f"{subject} {n}")
    body = await _counts(api, alice, group_by="subject")
    assert body["total"] == sum(sizes.values())
    assert body["groups"] == [
        {"value": "user:ben", "count": 3},
        {"value": "user:cat", "count": 2},
        {"value": "user:dan", "count": 2},
    ]
    assert body["more_groups"] is True
    narrowed = await _counts(api, alice, group_by="subject", subject="user:eve")
    assert narrowed["groups"] == [{"value": "user:eve", "count": 1}]
    assert narrowed["more_groups"] is False


async def test_a_space_filter_needs_read_on_that_space(api: Api) -> None:
    alice = await api.new_agent("alice")
    bob = await api.new_agent("bob")
    other = await api.other_tenant()
    carol = await other.new_agent("carol")
    mine = await api.remember(alice, key="a", value="alice's")
    bobs = await api.remember(bob, key="a", value="bob's")
    theirs = await other.remember(carol, key="a", value="carol's")
    own = await _counts(api, alice, space_id=mine["space_id"], group_by="space")
    assert own["groups"] == [{"value": mine["space_id"], "count": 1}]

    random_space = str(uuid.uuid4())
    for path in ("/v1/memories/counts", "/v1/memories"):
        baseline = await api.http.get(
            path, params={"space_id": random_space}, headers=alice.headers
        )
        assert_problem(baseline, 404, "space-not-found")
        for foreign in (bobs["space_id"], theirs["space_id"]):
            response = await api.http.get(path, params={"space_id": foreign}, headers=alice.headers)
            assert_problem(response, 404, "space-not-found")
            assert response.content.replace(foreign.encode(), b"{id}") == (
                baseline.content.replace(random_space.encode(), b"{id}")
            )
    for foreign in (bobs["space_id"], theirs["space_id"]):
        searched = await api.search(alice, "whose", filters={"space_id": foreign})
        assert_problem(searched, 404, "space-not-found")


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"group_by": "colour"}, "group_by"),
        ({"kind": "rumour"}, "kind"),
        ({"subject": "has space"}, "subject"),
    ],
)
async def test_bad_count_parameters_are_problems(
    api: Api, params: dict[str, str], field: str
) -> None:
    alice = await api.new_agent("alice")
    response = await api.http.get("/v1/memories/counts", params=params, headers=alice.headers)
    problem = assert_problem(response, 422, "invalid-request")
    assert [error["field"] for error in problem["errors"]] == [field], problem


async def test_a_malformed_space_id_is_a_malformed_id(api: Api) -> None:
    """A malformed id is 400 malformed-id in a query as in a path (review item 22)."""
    alice = await api.new_agent("alice")
    response = await api.http.get(
        "/v1/memories/counts", params={"space_id": "not-a-uuid"}, headers=alice.headers
    )
    problem = assert_problem(response, 400, "malformed-id")
    assert [error["field"] for error in problem["errors"]] == ["space_id"], problem
