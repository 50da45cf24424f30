"""Hybrid recall: a vector leg and a lexical leg under the same Visible, fused by reciprocal
rank, with a default score floor so that "nothing relevant" is an empty answer. The oracle is
a brute-force fusion computed here in Python from the stored lexemes (PostgreSQL's parser is
the only part borrowed) and the embedder's vectors."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy import text

from service.memory.repository import RRF_K
from service.settings import MemorySettings
from tests.fixtures.api import Agent, Api
from tests.integration.memory.support import as_owner, assert_problem
from tests.integration.memory.test_search_strategy import (
    ALWAYS_WALK,
    _path_taken,
    limits,
    settings,
)

__all__ = ["settings"]  # the fixture `limits` parametrizes

ALICE = [
    "the billing service deploys on fridays between ten and noon",
    "deploy freeze on billing until the incident review closes",
    "redis-cache-07 listens on port 6380 and holds session tokens",
    "redis-cache-03 was decommissioned and its keys moved to redis-cache-07",
    "the on-call rotation changes every monday morning",
    "invoices are archived for seven years to meet tax rules",
    "error E1047 means the pdf renderer ran out of memory",
    "the wifi password of the berlin office rotates monthly",
    "lunch is catered on thursdays at the berlin office",
    "the search latency target is 150 ms at p95",
    "staging runs on postgres 16 with pgvector",
    "the staging read replica runs on postgres 14",
]
# Bob's rows (the same tenant, spaces alice cannot read) repeat alice's rarest words many
# times: if rarity were counted over rows alice cannot see, her ranks would move.
BOB = [f"redis-cache-07 error E1047 billing deploy freeze note {n}" for n in range(30)]
QUERIES = [
    "Which port does redis-cache-07 use?",
    "Is there a deploy freeze on billing right now?",
    "What does error E1047 mean?",
    "when does the on-call rotation change",
    "What Postgres version does staging run?",
    "is the",
    "What is the capital of Australia?",
]


@dataclass(frozen=True)
class Row:
    id: str
    cosine: float
    lexemes: frozenset[str]


async def _rows(api: Api, agent: Agent) -> list[Row]:
    """Alice's rows as stored (lexemes from PostgreSQL) with their cosine to nothing yet."""
    async with as_owner(api.runtime) as conn:
        found = await conn.execute(
            text(
                "SELECT id::text, tsvector_to_array(lexical) FROM memories "
                "WHERE writer_id = CAST(:w AS uuid)"
            ),
            {"w": agent.principal_id},
        )
        return [Row(i, 0.0, frozenset(lexemes)) for i, lexemes in found.all()]


async def _terms(api: Api, query: str, config: str = "english") -> list[str]:
    async with as_owner(api.runtime) as conn:
        found = await conn.scalar(
            text("SELECT tsvector_to_array(to_tsvector(CAST(:c AS regconfig), :q))"),
            {"c": config, "q": query},
        )
    return list(found)


async def _brute_force(
    api: Api, rows: list[Row], values: dict[str, str], query: str, floor: float | None, k: int
) -> list[str]:
    """The documented fusion, by hand: both legs over every visible row, RRF with k = 60,
    admitted when cosine >= floor or term-weight share >= max(0.5, floor)."""
    embedder = api.runtime.embedder
    [q] = await embedder.embed([query])
    ids = [row.id for row in rows]
    vectors = np.asarray(await embedder.embed([values[i] for i in ids]), dtype=np.float64)
    qv = np.asarray(q, dtype=np.float64)
    cosines = (vectors @ qv) / (np.linalg.norm(vectors, axis=1) * np.linalg.norm(qv))
    cosine = dict(zip(ids, (float(c) for c in cosines), strict=True))
    terms = await _terms(api, query)
    n = len(rows)
    df = {t: sum(1 for row in rows if t in row.lexemes) for t in terms}
    idf = {t: math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5)) for t in terms}
    total = sum(idf.values())
    weight = {
        row.id: min(1.0, sum(idf[t] for t in terms if t in row.lexemes) / total)
        for row in rows
        if any(t in row.lexemes for t in terms)
    }
    by_vector = sorted(ids, key=lambda i: (1 - cosine[i], i))
    by_words = sorted(weight, key=lambda i: (-weight[i], i))
    vector_rank = {i: r + 1 for r, i in enumerate(by_vector)}
    word_rank = {i: r + 1 for r, i in enumerate(by_words)}

    def admitted(i: str) -> bool:
        if floor is None:
            return True
        return cosine[i] >= floor or weight.get(i, -1.0) >= max(0.5, floor)

    def fused(i: str) -> float:
        by_v = 1.0 / (RRF_K + vector_rank[i])
        by_w = 1.0 / (RRF_K + word_rank[i]) if i in word_rank else 0.0
        return by_v + by_w

    chosen = [i for i in ids if admitted(i)]
    return sorted(chosen, key=lambda i: (-fused(i), 1 - cosine[i], i))[:k]


async def _world(api: Api) -> tuple[Agent, list[Row], dict[str, str]]:
    alice = await api.new_agent("alice")
    values = {}
    for n, value in enumerate(ALICE):
        written = await api.remember(alice, key=f"alice.{n}", value=value)
        values[written["id"]] = value
    bob = await api.new_agent("bob")
    for n, value in enumerate(BOB):
        await api.remember(bob, key=f"bob.{n}", value=value)
    other = await api.other_tenant()
    mallory = await other.new_agent("mallory")
    for n, value in enumerate(BOB[:10]):
        await other.remember(mallory, key=f"mallory.{n}", value=value)
    return alice, await _rows(api, alice), values


async def _hits(api: Api, agent: Agent, query: str, **fields: Any) -> list[dict[str, Any]]:
    response = await api.search(agent, query, **fields)
    assert response.status_code == 200, response.text
    hits: list[dict[str, Any]] = response.json()["hits"]
    return hits


async def test_hybrid_equals_a_brute_force_fusion(api: Api) -> None:
    alice, rows, values = await _world(api)
    for query in QUERIES:
        for floor, request in ((0.25, {}), (None, {"min_score": 0}), (0.45, {"min_score": 0.45})):
            for k in (3, 10):
                expected = await _brute_force(api, rows, values, query, floor, k)
                hits = await _hits(api, alice, query, k=k, **request)
                assert [h["memory"]["id"] for h in hits] == expected, (query, floor, k)
                for hit in hits:
                    assert hit["fused_score"] is not None
                    assert floor is None or (
                        hit["score"] >= floor or hit["lexical_score"] >= max(0.5, floor)
                    )


async def test_hybrid_never_under_fills_among_the_hits_that_clear_the_floor(api: Api) -> None:
    alice, rows, values = await _world(api)
    for query in QUERIES:
        clearing = await _brute_force(api, rows, values, query, 0.25, len(rows))
        for k in sorted({1, 2, len(clearing), len(clearing) + 3} - {0}):
            hits = await _hits(api, alice, query, k=k)
            assert len(hits) == min(k, len(clearing)), (query, k)
        everything = await _hits(api, alice, query, k=len(rows) + 5, min_score=0)
        assert len(everything) == len(rows), query  # floor off: every visible row, no more


@limits(ALWAYS_WALK)
async def test_on_the_approximate_path_the_fused_answer_is_the_same(
    api: Api, span_exporter: InMemorySpanExporter
) -> None:
    """Past the exact limit the vector leg walks the HNSW index; the walk's answer stands when
    at least k of its rows clear the floor, else both legs are ranked exactly. On a set this
    small the walk finds the true nearest, so either way the answer is the brute-force fusion,
    never short."""
    alice, rows, values = await _world(api)
    span_exporter.clear()
    for query in QUERIES:
        for floor, request in ((0.25, {}), (None, {"min_score": 0})):
            expected = await _brute_force(api, rows, values, query, floor, 5)
            hits = await _hits(api, alice, query, k=5, **request)
            assert [h["memory"]["id"] for h in hits] == expected, (query, floor)
            clearing = await _brute_force(api, rows, values, query, floor, len(rows))
            path = _path_taken(span_exporter)
            if floor is None:
                assert path == "approximate", query  # the walk's rows all clear no floor
            elif len(clearing) < 5:
                assert path == "exact", query  # fewer than k clear: the walk cannot answer


async def test_an_unrelated_question_answers_nothing_and_min_score_0_answers_k(api: Api) -> None:
    alice = await api.new_agent("alice")
    await api.remember(
        alice, key="freeze", value="deploy freeze on billing until friday", ttl_seconds=1
    )
    for n, value in enumerate(ALICE[4:]):
        await api.remember(alice, key=f"alice.{n}", value=value)
    async with as_owner(api.runtime) as conn:  # the freeze notice has expired
        await conn.execute(
            text("UPDATE memories SET expires_at = now() - interval '1 hour' WHERE key = 'freeze'")
        )
        await conn.commit()
    question = "Is there a deploy freeze on billing right now?"
    for mode in ("hybrid", "vector", "lexical"):
        response = await api.search(alice, question, k=5, mode=mode)
        assert response.json()["hits"] == [], mode
        assert response.json()["min_score"] == 0.25
    strangers = await api.search(alice, question, k=5, min_score=0)
    assert len(strangers.json()["hits"]) == 5
    assert strangers.json()["min_score"] is None
    # Stop words alone never let a stranger in (English drops them from the query).
    assert await _hits(api, alice, "is the a on", k=5, mode="lexical") == []


async def test_lexical_mode_finds_an_identifier_and_ranks_by_term_weight(api: Api) -> None:
    alice, _, values = await _world(api)
    hits = await _hits(api, alice, "redis-cache-03", k=5, mode="lexical")
    # The row naming it holds every term; the sibling shares only 'redis' and 'cache'.
    assert values[hits[0]["memory"]["id"]] == ALICE[3]
    assert hits[0]["lexical_score"] == pytest.approx(1.0)
    weights = [h["lexical_score"] for h in hits]
    assert weights == sorted(weights, reverse=True)
    assert all(w >= 0.5 for w in weights)  # the default lexical floor
    assert {values[h["memory"]["id"]] for h in hits} <= {ALICE[2], ALICE[3]}
    assert -1.0 <= hits[0]["score"] <= 1.0  # the cosine, in every mode
    vector_only = await _hits(api, alice, "redis-cache-03", k=5, mode="vector")
    assert all(h["lexical_score"] is None and h["fused_score"] is None for h in vector_only)


async def test_a_bad_mode_is_a_problem_that_names_the_choices(api: Api) -> None:
    alice = await api.new_agent("alice")
    response = await api.search(alice, "deploy", mode="fuzzy")
    problem = assert_problem(response, 422, "invalid-request")
    assert "mode" in str(problem)


async def test_the_tenant_floor_applies_when_the_request_names_none(api: Api) -> None:
    from tests.integration.tenants.support import platform

    alice = await api.new_agent("alice")
    await api.remember(alice, key="k", value="the billing service deploys on fridays")
    question = "what is the capital of france"
    assert await _hits(api, alice, question) == []
    admin = await platform(api)
    path = f"/v1/tenants/{api.tenant_id}"
    changed = await admin.http.patch(
        path, json={"settings": {"score_floor": 0}}, headers=admin.admin.headers
    )
    assert changed.status_code == 200, changed.text
    assert len(await _hits(api, alice, question)) == 1  # the tenant turned its floor off
    assert await _hits(api, alice, question, min_score=0.25) == []  # the request wins


async def test_the_tenant_language_applies_to_new_writes_and_every_query(api: Api) -> None:
    """English stems ("deploys", "deploying" -> deploy); simple does not. A row keeps the
    lexemes of the language it was written under."""
    from tests.integration.tenants.support import platform

    alice = await api.new_agent("alice")
    english = await api.remember(alice, key="a", value="deploys happen on fridays")
    found = await _hits(api, alice, "deploying", mode="lexical")
    assert [h["memory"]["id"] for h in found] == [english["id"]]
    admin = await platform(api)
    path = f"/v1/tenants/{api.tenant_id}"
    bad = await admin.http.patch(
        path, json={"settings": {"text_search_config": "klingon"}}, headers=admin.admin.headers
    )
    problem = assert_problem(bad, 422, "tenant-settings-invalid")
    assert problem["field"] == "settings.text_search_config"
    assert "english" in problem["allowed"]
    assert "simple" in problem["allowed"]
    changed = await admin.http.patch(
        path, json={"settings": {"text_search_config": "simple"}}, headers=admin.admin.headers
    )
    assert changed.status_code == 200, changed.text
    simple = await api.remember(alice, key="b", value="deploys happen on mondays")
    async with as_owner(api.runtime) as conn:
        configs: dict[str, str] = dict(
            (await conn.execute(text("SELECT key, lexical_config::text FROM memories"))).all()
        )
    assert configs == {"a": "english", "b": "simple"}
    found = await _hits(api, alice, "deploys", mode="lexical")
    assert [h["memory"]["id"] for h in found] == [simple["id"]]  # 'deploy' != 'deploys'
    assert await _hits(api, alice, "deploying", mode="lexical") == []


def test_the_operator_floor_sits_between_strangers_and_matches() -> None:
    # The documented default (docs/recall.md): WordLlama strangers <= 0.21, matches >= 0.3.
    assert 0.21 < MemorySettings().score_floor < 0.3
