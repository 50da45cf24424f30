"""Search is never under-filled: with k visible memories among many more similar invisible ones,
exactly k come back, ranked like a brute-force cosine ranking, with or without an ANN index."""

from __future__ import annotations

from typing import Any

import numpy as np
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.fixtures.api import Agent, Api
from tests.integration.memory.support import count_memories, scalar

QUERY = "when is the billing service deploy window"

# The caller's own memories: mostly unrelated to the query.
ALICE_VALUES = [
    "the office plant on the third floor needs water on mondays",
    "lunch orders go to the thai place on thursdays",
    "the billing dashboard lives at grafana billing overview",
    "alice prefers dark mode in every editor",
    "the quarterly report is due at the end of march",
    "parking passes are renewed every january",
    "the wifi password rotates every ninety days",
    "invoices are archived for seven years",
    "the coffee machine is descaled on fridays",
    "team offsite is planned for september in lisbon",
]


def _bruteforce(query: list[float], vectors: list[list[float]], ids: list[str]) -> list[str]:
    q = np.asarray(query, dtype=np.float64)
    m = np.asarray(vectors, dtype=np.float64)
    scores = (m @ q) / (np.linalg.norm(m, axis=1) * np.linalg.norm(q))
    order = sorted(range(len(ids)), key=lambda i: (-scores[i], ids[i]))
    return [ids[i] for i in order]


async def _search_ids(api: Api, agent: Agent, **fields: Any) -> list[dict[str, Any]]:
    response = await api.search(agent, QUERY, **({"mode": "vector", "min_score": 0} | fields))
    assert response.status_code == 200, response.text
    hits: list[dict[str, Any]] = response.json()["hits"]
    return hits


async def _fill(api: Api, agent: Agent, count: int, prefix: str) -> None:
    for n in range(count):
        await api.remember(
            agent,
            key=f"{prefix}.{n}",
            value=f"the billing service deploy window is friday slot {n} ({prefix})",
        )


async def test_k_visible_among_many_invisible_equals_brute_force(
    api: Api, owner_engine: AsyncEngine
) -> None:
    alice = await api.new_agent("alice")
    mine = [
        await api.remember(alice, key=f"alice.{n}", value=value)
        for n, value in enumerate(ALICE_VALUES)
    ]
    for name in ("bob", "carol", "dave"):
        await _fill(api, await api.new_agent(name), 100, name)
    other = await api.other_tenant()
    await _fill(other, await other.new_agent("mallory"), 100, "mallory")
    assert await count_memories(api.runtime) == 410

    ids = [memory["id"] for memory in mine]
    embedder = api.runtime.embedder
    [query_vector] = await embedder.embed([QUERY])
    expected = _bruteforce(query_vector, await embedder.embed(ALICE_VALUES), ids)

    async def check() -> None:
        hits = await _search_ids(api, alice, k=10)
        assert len(hits) == 10
        assert [hit["memory"]["id"] for hit in hits] == expected
        for hit in hits:
            assert hit["memory"]["provenance"]["writer_id"] == alice.principal_id
            assert hit["memory"]["space_id"] == mine[0]["space_id"]
            assert "slot" not in hit["memory"]["value"]
        scores = [hit["score"] for hit in hits]
        assert scores == sorted(scores, reverse=True)
        q = np.asarray(query_vector)
        for hit in hits:
            v = np.asarray((await embedder.embed([hit["memory"]["value"]]))[0])
            cosine = float(v @ q / (np.linalg.norm(v) * np.linalg.norm(q)))
            assert abs(hit["score"] - cosine) < 1e-4
        # Fewer asked, fewer given: a prefix of the same ranking.
        top3 = await _search_ids(api, alice, k=3)
        assert [hit["memory"]["id"] for hit in top3] == expected[:3]
        # More asked than visible: still only the visible ten.
        top50 = await _search_ids(api, alice, k=50)
        assert [hit["memory"]["id"] for hit in top50] == expected

    await check()

    # A global ANN index over every tenant's vectors must not change the answer: an index scan
    # that ranks first and filters after returns (almost) nothing for alice here. The planner
    # only picks such a scan when it beats sorting (a large visible set); forbidding sorts and
    # sequential scans on every new connection makes it the planner's first choice here.
    async with owner_engine.begin() as conn:
        await conn.execute(
            text(
                "CREATE INDEX ix_test_memories_hnsw ON memories "
                "USING hnsw (embedding vector_cosine_ops)"
            )
        )
        await conn.execute(text("ANALYZE memories"))
        for setting in ("enable_sort", "enable_seqscan"):
            await conn.execute(
                text(
                    "DO $$ BEGIN EXECUTE format("
                    f"'ALTER DATABASE %I SET {setting} = off', current_database()); END $$"
                )
            )
    await api.runtime.engine.dispose()
    # The adversarial plan is real: a plain "order by distance, then filter" query under-fills.
    naive = await scalar(
        api.runtime,
        "SELECT count(*) FROM (SELECT id FROM memories WHERE tenant_id = :tenant "
        "AND space_id = :space ORDER BY embedding <=> CAST(:query AS vector) LIMIT 10) AS top",
        tenant=api.tenant_id,
        space=mine[0]["space_id"],
        query="[" + ",".join(str(x) for x in query_vector) + "]",
    )
    assert naive < 10
    await check()


async def test_high_min_score_answers_nothing_relevant(api: Api) -> None:
    alice = await api.new_agent("alice")
    for n, value in enumerate(ALICE_VALUES[:5]):
        await api.remember(alice, key=f"alice.{n}", value=value)
    response = await api.search(alice, QUERY, k=10, min_score=0.99, mode="vector")
    assert response.status_code == 200, response.text
    assert response.json() == {"hits": [], "k": 10, "min_score": 0.99}

    # A threshold the best hit clears keeps exactly the hits above it.
    everything = (await api.search(alice, QUERY, k=10, min_score=0, mode="vector")).json()["hits"]
    assert len(everything) == 5
    threshold = (everything[1]["score"] + everything[2]["score"]) / 2
    some = await api.search(alice, QUERY, k=10, min_score=threshold, mode="vector")
    assert [hit["memory"]["id"] for hit in some.json()["hits"]] == [
        hit["memory"]["id"] for hit in everything[:2]
    ]
    assert all(hit["score"] >= threshold for hit in some.json()["hits"])
