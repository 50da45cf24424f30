"""Every read of memories has a bounded cost, and a bound that bites answers a problem the
caller can act on, changing nothing (review item 16). Above the exact limit a search could be
forced, with a `min_score` near 1, into an exact ranking of the caller's whole visible set on
every call; now a search over more visible rows than the fallback cap is refused whatever the
walk would have found, and every read statement runs under a statement timeout."""

from __future__ import annotations

import hashlib
import itertools
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import func, select

from service.auth.principal import Principal
from service.calls import Call
from service.embeddings import model_tag
from service.memory import repository
from service.memory.repository import MemoryFilters
from service.policy.visible import Action, visible
from service.settings import MemorySettings, Settings
from tests.conftest import make_settings
from tests.fixtures.api import Agent, Api
from tests.integration.memory.bulk import copy_memories
from tests.integration.memory.support import assert_problem, count_memories


@pytest.fixture
def settings(database_url: str, tmp_path: Path, request: pytest.FixtureRequest) -> Settings:
    limits = getattr(request, "param", MemorySettings())
    return replace(make_settings(database_url, tmp_path), memory=limits)


def limits(memory: MemorySettings) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("settings", [memory], indirect=True, ids=["limits"])


async def _load(api: Api, alice: Agent, space_id: str, rows: int, kinds: int = 1) -> None:
    """`rows` memories in alice's space, random unit vectors, kinds `k0`..: a visible set of
    a chosen size without embedding each one."""
    rng = np.random.default_rng(7)
    vectors = rng.standard_normal((rows, 256))
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    tenant, owner = uuid.UUID(api.tenant_id), uuid.UUID(alice.principal_id)
    model = model_tag(api.runtime.embedder)  # the rows are this model's vectors
    columns = (
        "tenant_id", "id", "space_id", "owner_id", "writer_id", "client_id", "subject", "kind",
        "key", "value", "content_hash", "embedding", "embedding_model",
    )  # fmt: skip
    kind_names = ("fact", "preference", "decision", "episode")

    def records() -> Iterator[tuple[object, ...]]:
        for n, vector in enumerate(vectors):
            value = f"note {n}"
            embedding = "[" + ",".join(f"{x:.6f}" for x in vector) + "]"
            yield (
                tenant, uuid.uuid4(), uuid.UUID(space_id), owner, owner, alice.client_id,
                f"user:{n % 7}", kind_names[n % kinds], f"note.{n}", value,
                hashlib.sha256(value.encode()).digest(), embedding, model,
            )  # fmt: skip

    copy_memories(api.runtime.settings.database.url, columns, records())


async def _alice(api: Api) -> tuple[Agent, str]:
    alice = await api.new_agent("alice")
    seed = await api.remember(alice, key="seed", value="alice seeds her space")
    return alice, str(seed["space_id"])


@limits(MemorySettings(exact_search_max_rows=10, search_fallback_max_rows=40))
async def test_a_search_over_more_rows_than_the_fallback_cap_is_refused(api: Api) -> None:
    """60 visible rows, exact limit 10, fallback cap 40: every search is refused up front (the
    walk is never consulted, so the answer cannot tell what other rows it met), with a detail
    naming what to narrow; a narrower search (one kind: 15 rows) is answered in full."""
    alice, space_id = await _alice(api)
    await _load(api, alice, space_id, 59, kinds=4)
    before = await count_memories(api.runtime)
    for mode, floor in itertools.product(("vector", "hybrid", "lexical"), (0.999, 0)):
        response = await api.search(alice, "anything", k=10, mode=mode, min_score=floor)
        problem = assert_problem(response, 422, "search-too-broad")
        assert "40" in problem["detail"]
        for hint in ("space_id", "kind", "subject"):
            assert hint in problem["detail"]
        assert problem["max_visible_rows"] == 40
    assert await count_memories(api.runtime) == before

    for mode in ("vector", "hybrid"):
        narrowed = await api.search(
            alice, "anything", k=20, filters={"kind": "preference"}, mode=mode, min_score=0
        )
        assert narrowed.status_code == 200, narrowed.text
        hits = narrowed.json()["hits"]
        assert len(hits) == 15  # above the exact limit, below the cap: the fallback fills k
        assert {hit["memory"]["kind"] for hit in hits} == {"preference"}


@limits(MemorySettings(exact_search_max_rows=10, search_fallback_max_rows=40))
async def test_below_the_cap_a_floor_is_still_answered_exactly(api: Api) -> None:
    """30 visible rows: a floor that cuts into the walk is still ranked exactly (never
    under-filled); the cap only bounds how many rows that ranking may cost."""
    alice, space_id = await _alice(api)
    await _load(api, alice, space_id, 29)
    everything = (await api.search(alice, "anything", k=30, mode="vector", min_score=0)).json()[
        "hits"
    ]
    assert len(everything) == 30
    floor = (everything[4]["score"] + everything[5]["score"]) / 2
    some = await api.search(alice, "anything", k=10, min_score=floor, mode="vector")
    assert [hit["memory"]["id"] for hit in some.json()["hits"]] == [
        hit["memory"]["id"] for hit in everything[:5]
    ]


@limits(MemorySettings(read_statement_timeout_ms=1))
async def test_a_read_past_its_statement_timeout_is_a_problem(api: Api) -> None:
    """20,000 visible rows take far longer than 1 ms to rank or group: the search answers 422
    `search-too-broad` and the counts 422 `read-too-broad`, each saying what to change, and
    the service goes on answering (the setting is per transaction, never left behind)."""
    alice, space_id = await _alice(api)
    await _load(api, alice, space_id, 19_999)
    before = await count_memories(api.runtime)

    search = await api.search(alice, "anything", k=10, mode="vector", min_score=0)
    problem = assert_problem(search, 422, "search-too-broad")
    assert "1 ms" in problem["detail"]
    assert "space_id" in problem["detail"]
    counts = await api.http.get(
        "/v1/memories/counts", params={"group_by": "subject"}, headers=alice.headers
    )
    problem = assert_problem(counts, 422, "read-too-broad")
    assert "space_id" in problem["detail"]
    assert await count_memories(api.runtime) == before

    # The service goes on: the next call is a new transaction (a write is not a read).
    written = await api.remember(alice, key="after", value="still answering")
    assert written["value"] == "still answering"


async def test_the_read_budget_is_restored_for_the_rest_of_the_transaction(api: Api) -> None:
    """Inside a call the budget covers the reads only: the audit append and commit after them
    run under the previous `statement_timeout` (an audit append may wait on its tenant lock)."""
    alice, _ = await _alice(api)
    caller = Principal(
        tenant_id=uuid.UUID(api.tenant_id),
        principal_id=uuid.UUID(alice.principal_id),
        client_id=alice.client_id,
        scopes=frozenset({"read:memory"}),
        token_id="test",
        issuer="test",
    )
    setting = select(func.current_setting("statement_timeout"))
    session = Call(api.runtime, "memory.list", "GET", "test", caller=caller).db
    try:
        before = await session.scalar(setting)
        async with repository.read_budget(session, 1234):
            assert await session.scalar(setting) == "1234ms"
            rows = await repository.list_page(
                session, visible(caller, Action.READ), MemoryFilters(), after=None, limit=5
            )
            assert [row.key for row in rows] == ["seed"]
        assert await session.scalar(setting) == before
    finally:
        await session.rollback()
        await session.close()
