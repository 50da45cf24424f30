"""Search picks its path per query by the size of the caller's visible set. With 1% of a tenant
visible, the exact path answers k hits equal to brute force; the approximate path (an HNSW
walk, forced here by a zero threshold) reaches recall@10 >= 0.95 against the same brute force,
and really walks the HNSW index. Memories are real embeddings of varied sentences, not random
vectors, so the index meets the kind of data it is built for. The path taken is read from the
`memory.rank` span: the answer does not say (whether a walk comes back short depends on rows
the caller may not see)."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy import func, select

from bench.corpus import sentences
from service.auth.principal import Principal
from service.calls import Call
from service.embeddings import model_tag
from service.memory import repository
from service.memory.repository import AnnTuning, MemoryFilters
from service.policy.visible import Action, visible
from service.settings import MemorySettings, Settings
from tests.conftest import make_settings
from tests.fixtures.api import Agent, Api
from tests.integration.memory.bulk import copy_memories

SPACES = 100
PER_SPACE = 50
QUERIES = 40
K = 10

ALWAYS_WALK = MemorySettings(exact_search_max_rows=0)
"""Every search with any visible row takes the approximate path."""


@pytest.fixture
def settings(database_url: str, tmp_path: Path, request: pytest.FixtureRequest) -> Settings:
    limits = getattr(request, "param", MemorySettings())
    return replace(make_settings(database_url, tmp_path), memory=limits)


COLUMNS = (
    "tenant_id", "id", "space_id", "owner_id", "writer_id", "client_id", "subject", "kind", "key",
    "value", "content_hash", "embedding", "embedding_model",
)  # fmt: skip


def limits(memory: MemorySettings) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("settings", [memory], indirect=True, ids=["limits"])


async def _world(api: Api) -> tuple[Agent, dict[str, list[float]]]:
    """Alice's personal space holds 1% of the tenant (50 of 5,000 memories); 99 team spaces she
    cannot read hold the rest, written with the same sentence generator."""
    alice = await api.new_agent("alice")
    seed = await api.remember(alice, key="seed", value="alice seeds her space")
    own_space = seed["space_id"]
    texts = sentences(SPACES * PER_SPACE - 1, seed=11)
    vectors = await api.runtime.embedder.embed(texts)
    spaces = [uuid.UUID(own_space)] + [uuid.uuid4() for _ in range(SPACES - 1)]
    tenant, owner = uuid.UUID(api.tenant_id), uuid.UUID(alice.principal_id)
    mine: dict[str, list[float]] = {}
    with (
        psycopg.connect(api.runtime.settings.database.url, autocommit=True) as conn,
        conn.cursor().copy("COPY spaces (tenant_id, id, kind, name) FROM STDIN") as copy,
    ):
        for space in spaces[1:]:
            copy.write_row((tenant, space, "team", f"team {space}"))
    model = model_tag(api.runtime.embedder)  # the rows are this model's vectors

    def records() -> Iterator[tuple[object, ...]]:
        for n, (value, vector) in enumerate(zip(texts, vectors, strict=True)):
            memory_id, space = uuid.uuid4(), spaces[(n + 1) % SPACES]
            if space == spaces[0]:
                mine[str(memory_id)] = vector
            digest = hashlib.sha256(value.encode()).digest()
            embedding = "[" + ",".join(f"{x:.7f}" for x in vector) + "]"
            fields = (tenant, memory_id, space, owner, owner, alice.client_id)
            yield (*fields, "team:notes", "fact", f"note.{n}", value, digest, embedding, model)

    copy_memories(api.runtime.settings.database.url, COLUMNS, records())
    [mine[seed["id"]]] = await api.runtime.embedder.embed([seed["value"]])
    assert len(mine) == PER_SPACE
    return alice, mine


def _brute_force(query: list[float], mine: dict[str, list[float]]) -> list[tuple[str, float]]:
    """(id, cosine similarity) of every memory alice can see, best first (ties by id)."""
    ids = list(mine)
    matrix = np.asarray([mine[i] for i in ids], dtype=np.float64)
    q = np.asarray(query, dtype=np.float64)
    scores = matrix @ q / (np.linalg.norm(matrix, axis=1) * np.linalg.norm(q))
    order = sorted(range(len(ids)), key=lambda i: (-scores[i], ids[i]))
    return [(ids[i], float(scores[i])) for i in order]


def _path_taken(spans: InMemorySpanExporter) -> str:
    [rank] = [span for span in spans.get_finished_spans() if span.name == "memory.rank"]
    spans.clear()
    assert rank.attributes is not None
    return str(rank.attributes["memgate.search.strategy"])


async def _searches(
    api: Api,
    alice: Agent,
    mine: dict[str, list[float]],
    spans: InMemorySpanExporter,
    floor_at_kth: bool = False,
) -> list[Any]:
    """(answer, path taken, brute-force top k) per query; with `floor_at_kth`, each search
    asks for a score floor just under the k-th true score (so exactly k rows clear it)."""
    queries = sentences(QUERIES, seed=99)
    outcomes = []
    spans.clear()
    for query, vector in zip(queries, await api.runtime.embedder.embed(queries), strict=True):
        truth = _brute_force(vector, mine)[:K]
        floor = {"min_score": truth[-1][1] - 1e-4} if floor_at_kth else {"min_score": 0}
        response = await api.search(alice, query, k=K, mode="vector", **floor)
        assert response.status_code == 200, response.text
        outcomes.append((response.json(), _path_taken(spans), truth))
    return outcomes


async def test_one_percent_visible_is_ranked_exactly(
    api: Api, span_exporter: InMemorySpanExporter
) -> None:
    alice, mine = await _world(api)
    for body, path, truth in await _searches(api, alice, mine, span_exporter):
        assert path == "exact"
        assert set(body) == {"hits", "k", "min_score"}, "the answer never names its path"
        assert [hit["memory"]["id"] for hit in body["hits"]] == [i for i, _ in truth]


@limits(ALWAYS_WALK)
async def test_the_approximate_path_at_one_percent_has_recall_of_at_least_095(
    api: Api, span_exporter: InMemorySpanExporter
) -> None:
    alice, mine = await _world(api)
    found = 0
    for body, path, truth in await _searches(api, alice, mine, span_exporter):
        assert path == "approximate"
        assert set(body) == {"hits", "k", "min_score"}
        hits = [hit["memory"]["id"] for hit in body["hits"]]
        assert len(hits) == K
        assert set(hits) <= set(mine), "a hit outside alice's space"
        # A hit counts when it is at least as similar as the k-th true one (ties are no miss).
        kth = truth[-1][1]
        found += sum(1 for hit in body["hits"] if hit["score"] >= kth - 1e-5)
    recall = found / (K * QUERIES)
    print(f"approximate path, 1% visible: recall@{K} = {recall:.3f}")
    assert recall >= 0.95, recall


@limits(ALWAYS_WALK)
async def test_the_approximate_path_walks_the_hnsw_index(api: Api) -> None:
    alice, _ = await _world(api)
    caller = Principal(
        tenant_id=uuid.UUID(api.tenant_id),
        principal_id=uuid.UUID(alice.principal_id),
        client_id=alice.client_id,
        scopes=frozenset({"read:memory"}),
        token_id="test",
        issuer="test",
    )
    [vector] = await api.runtime.embedder.embed(["who owns the billing service"])
    scans = select(func.pg_stat_get_xact_numscans(func.to_regclass("ix_memories_embedding_hnsw")))
    session = Call(api.runtime, "memory.search", "POST", "test", caller=caller).db
    try:
        scope = visible(caller, Action.READ)
        await repository.search_exact(session, scope, vector, MemoryFilters(), k=K, min_score=None)
        assert await session.scalar(scans) == 0
        tuning = AnnTuning(ef_search=200, max_scan_tuples=40_000)
        walked = await repository.search_approximate(
            session, scope, vector, MemoryFilters(), k=K, tuning=tuning
        )
        assert len(walked) == K
        assert await session.scalar(scans) == 1
        # Sorting is back on for whatever else the request's transaction runs.
        assert await session.scalar(select(func.current_setting("enable_sort"))) == "on"
    finally:
        await session.rollback()
        await session.close()


@limits(replace(ALWAYS_WALK, ann_ef_search=10, ann_max_scan_tuples=10))
async def test_a_walk_that_comes_back_short_falls_back_to_exact(
    api: Api, span_exporter: InMemorySpanExporter
) -> None:
    """Alice sees 50 rows scattered among 5,000; a walk of about ten tuples cannot find ten of
    hers, so the exact path answers: k hits, equal to brute force."""
    alice, mine = await _world(api)
    for body, path, truth in await _searches(api, alice, mine, span_exporter):
        assert path == "exact"
        assert [hit["memory"]["id"] for hit in body["hits"]] == [i for i, _ in truth]


@limits(ALWAYS_WALK)
async def test_a_score_floor_never_under_fills_the_answer(
    api: Api, span_exporter: InMemorySpanExporter
) -> None:
    """Exactly k visible rows clear each floor, so k must come back: a walk that missed one of
    them (recall < 1) cannot answer with fewer; the exact path answers instead."""
    alice, mine = await _world(api)
    paths = []
    for body, path, truth in await _searches(api, alice, mine, span_exporter, floor_at_kth=True):
        assert [hit["memory"]["id"] for hit in body["hits"]] == [i for i, _ in truth]
        paths.append(path)
    assert "approximate" in paths, "the walk never answered; the test proves nothing"


@limits(ALWAYS_WALK)
async def test_a_floor_that_cuts_into_the_walk_is_answered_exactly(
    api: Api, span_exporter: InMemorySpanExporter
) -> None:
    alice, _ = await _world(api)
    query = "who owns the billing service"
    everything = (await api.search(alice, query, k=K, min_score=0, mode="vector")).json()
    assert _path_taken(span_exporter) == "approximate"
    scores = [hit["score"] for hit in everything["hits"]]
    floor = (scores[2] + scores[3]) / 2
    some = (await api.search(alice, query, k=K, min_score=floor, mode="vector")).json()
    assert _path_taken(span_exporter) == "exact"
    assert len(some["hits"]) >= 3
    assert all(hit["score"] >= floor for hit in some["hits"])
    nothing = (await api.search(alice, query, k=K, min_score=0.9999, mode="vector")).json()
    assert nothing["hits"] == []


@limits(MemorySettings(exact_search_max_rows=20, search_fallback_max_rows=1000))
async def test_rows_in_her_spaces_she_cannot_read_never_cost_her_completeness(
    api: Api, span_exporter: InMemorySpanExporter
) -> None:
    """The size gate counts every live row in the caller's spaces, read or not: 29 rows in
    alice's space that need a space she lacks push the bound (42) past the threshold (20)
    although she sees 13. Her search then takes the approximate path, and its answer is
    still exactly her own top k, and no row she cannot read."""
    alice = await api.new_agent("alice")
    texts = sentences(42, seed=5)
    mine: dict[str, list[float]] = {}
    for n, value in enumerate(texts[:13]):
        written = await api.remember(alice, key=f"mine.{n}", value=value)
        [mine[written["id"]]] = await api.runtime.embedder.embed([value])
    space = uuid.UUID(written["space_id"])
    tenant, owner = uuid.UUID(api.tenant_id), uuid.UUID(alice.principal_id)
    elsewhere = uuid.uuid4()  # a space alice holds no grant on
    hidden = set()
    model = model_tag(api.runtime.embedder)  # the rows are this model's vectors
    vectors = await api.runtime.embedder.embed(texts[13:])
    url, columns = api.runtime.settings.database.url, ", ".join((*COLUMNS, "read_requires"))
    with (
        psycopg.connect(url, autocommit=True) as conn,
        conn.cursor().copy(f"COPY memories ({columns}) FROM STDIN") as copy,
    ):
        for n, (value, vector) in enumerate(zip(texts[13:], vectors, strict=True)):
            memory_id = uuid.uuid4()
            hidden.add(str(memory_id))
            embedding = "[" + ",".join(f"{x:.7f}" for x in vector) + "]"
            digest = hashlib.sha256(value.encode()).digest()
            copy.write_row(
                (tenant, memory_id, space, owner, owner, alice.client_id, "team:notes",
                 "fact", f"derived.{n}", value, digest, embedding, model, [elsewhere])
            )  # fmt: skip
    assert len(hidden) == 29
    span_exporter.clear()
    for query, vector in zip(texts[13:23], vectors[:10], strict=True):
        truth = [i for i, _ in _brute_force(vector, mine)[:K]]
        response = await api.search(alice, query, k=K, min_score=0, mode="vector")
        assert response.status_code == 200, response.text
        ids = [hit["memory"]["id"] for hit in response.json()["hits"]]
        assert ids == truth
        assert not set(ids) & hidden
        assert _path_taken(span_exporter) in {"approximate", "exact"}
