"""List pagination (newest first, opaque cursor) and the subject/kind/key filters of list and
search, through the typed client (a problem answer would raise)."""

from __future__ import annotations

from typing import Any, Unpack

from memgate_client.types import MemoryPage, SearchFilters

from tests.fixtures.api import Agent, Api


async def _page(api: Api, agent: Agent, **params: Any) -> MemoryPage:
    return await api.client(agent).list_memories(**params)


async def _all_pages(api: Api, agent: Agent, **params: Any) -> list[list[str]]:
    pages: list[list[str]] = []
    cursor: str | None = params.pop("cursor", None)
    while True:
        page = await _page(api, agent, **params, cursor=cursor)
        pages.append([item["id"] for item in page["items"]])
        cursor = page["next_cursor"]
        if cursor is None:
            return pages
        assert len(pages) < 20, "pagination does not terminate"


async def test_seven_memories_in_pages_of_three(api: Api) -> None:
    alice = await api.new_agent("alice")
    bob = await api.new_agent("bob")
    written = []
    for n in range(7):
        written.append((await api.remember(alice, key=f"note.{n}", value=f"note {n}"))["id"])
        await api.remember(bob, key=f"note.{n}", value=f"bob's note {n}")
    newest_first = list(reversed(written))

    first = await _page(api, alice, limit=3)
    assert [item["id"] for item in first["items"]] == newest_first[:3]
    assert isinstance(first["next_cursor"], str)
    assert first["next_cursor"]
    assert [item["key"] for item in first["items"]] == ["note.6", "note.5", "note.4"]

    pages = await _all_pages(api, alice, limit=3)
    assert [len(page) for page in pages] == [3, 3, 1]
    flat = [memory_id for page in pages for memory_id in page]
    assert flat == newest_first
    assert len(set(flat)) == 7

    # The cursor is stable: the same cursor gives the same page again.
    second = await _page(api, alice, limit=3, cursor=first["next_cursor"])
    again = await _page(api, alice, limit=3, cursor=first["next_cursor"])
    assert second == again
    assert [item["id"] for item in second["items"]] == newest_first[3:6]

    # Exact multiples end with a null cursor, not an empty extra page.
    assert await _all_pages(api, alice, limit=7) == [newest_first]
    assert [len(page) for page in await _all_pages(api, alice, limit=1)] == [1] * 7
    default = await _page(api, alice)
    assert [item["id"] for item in default["items"]] == newest_first
    assert default["next_cursor"] is None


async def test_page_boundaries_survive_new_writes(api: Api) -> None:
    alice = await api.new_agent("alice")
    written = [
        (await api.remember(alice, key=f"note.{n}", value=f"note {n}"))["id"] for n in range(5)
    ]
    first = await _page(api, alice, limit=2)
    newer = await api.remember(alice, key="note.new", value="written between pages")
    rest = await _all_pages(api, alice, limit=2, cursor=first["next_cursor"])
    assert [memory_id for page in rest for memory_id in page] == list(reversed(written))[2:]
    assert newer["id"] not in [memory_id for page in rest for memory_id in page]


async def _fixtures(api: Api, agent: Agent) -> dict[str, str]:
    rows = {
        "billing-fact-window": (
            "service:billing",
            "fact",
            "deploy.window",
            "billing deploys friday",
        ),
        "billing-fact-owner": ("service:billing", "fact", "owner", "billing is owned by payments"),
        "billing-decision-window": (
            "service:billing",
            "decision",
            "deploy.window",
            "billing decided to deploy tuesdays",
        ),
        "search-fact-window": ("service:search", "fact", "deploy.window", "search deploys monday"),
        "search-pref-owner": ("service:search", "preference", "owner", "search prefers pagers"),
        "user-episode": ("user:42", "episode", "incident.7", "user 42 hit a deploy outage"),
    }
    ids = {}
    for name, (subject, kind, key, value) in rows.items():
        ids[name] = (await api.remember(agent, subject=subject, kind=kind, key=key, value=value))[
            "id"
        ]
    return ids


async def test_list_filters(api: Api) -> None:
    alice = await api.new_agent("alice")
    bob = await api.new_agent("bob")
    ids = await _fixtures(api, alice)
    await _fixtures(api, bob)  # same subjects/kinds/keys in another space: never listed

    async def listed(**params: str) -> set[str]:
        pages = await _all_pages(api, alice, limit=2, **params)
        return {memory_id for page in pages for memory_id in page}

    assert await listed(subject="service:billing") == {
        ids["billing-fact-window"],
        ids["billing-fact-owner"],
        ids["billing-decision-window"],
    }
    assert await listed(kind="fact") == {
        ids["billing-fact-window"],
        ids["billing-fact-owner"],
        ids["search-fact-window"],
    }
    assert await listed(key="deploy.window") == {
        ids["billing-fact-window"],
        ids["billing-decision-window"],
        ids["search-fact-window"],
    }
    assert await listed(subject="service:billing", kind="fact", key="deploy.window") == {
        ids["billing-fact-window"]
    }
    assert await listed(subject="service:search", kind="preference") == {ids["search-pref-owner"]}
    assert await listed(subject="service:nothing") == set()
    assert await listed(kind="summary") == set()
    assert await listed() == set(ids.values())
    page = await _page(api, alice, subject="user:42")
    assert [(item["subject"], item["kind"], item["key"]) for item in page["items"]] == [
        ("user:42", "episode", "incident.7")
    ]


async def test_search_filters(api: Api) -> None:
    alice = await api.new_agent("alice")
    bob = await api.new_agent("bob")
    ids = await _fixtures(api, alice)
    await _fixtures(api, bob)

    async def found(**filters: Unpack[SearchFilters]) -> list[str]:
        answer = await api.client(alice).search_memories(
            query="deploy", k=100, filters=filters, min_score=0
        )
        hits = answer["hits"]
        for hit in hits:
            memory: dict[str, Any] = dict(hit["memory"])
            for field, value in filters.items():
                assert memory[field] == value
            assert memory["provenance"]["writer_id"] == alice.principal_id
        return [hit["memory"]["id"] for hit in hits]

    assert set(await found(subject="service:billing")) == {
        ids["billing-fact-window"],
        ids["billing-fact-owner"],
        ids["billing-decision-window"],
    }
    assert set(await found(kind="fact")) == {
        ids["billing-fact-window"],
        ids["billing-fact-owner"],
        ids["search-fact-window"],
    }
    assert set(await found(key="deploy.window")) == {
        ids["billing-fact-window"],
        ids["billing-decision-window"],
        ids["search-fact-window"],
    }
    assert await found(subject="service:search", kind="fact", key="deploy.window") == [
        ids["search-fact-window"]
    ]
    assert await found(kind="summary") == []
    assert set(await found()) == set(ids.values())
    # A filter narrows before ranking: k=1 still finds the one match, however poorly it ranks.
    answer = await api.client(alice).search_memories(
        query="deploy", k=1, filters={"key": "owner", "kind": "preference"}, min_score=0
    )
    assert [hit["memory"]["id"] for hit in answer["hits"]] == [ids["search-pref-owner"]]
