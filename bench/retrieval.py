"""Retrieval quality of recall on a labelled set of our own (bench/retrieval_set.json): MRR,
Recall@5 and NDCG@5 of vector-only, lexical-only and hybrid search through the real API, under
the default score floor, and whether every question nothing answers comes back empty.

    .venv/bin/python -m bench.retrieval [--config english] [--min-score 0.25]

Starts its own embedded PostgreSQL (or uses DATABASE_URL), builds the real app, stores the
documents as one agent's memories in a fresh tenant and asks every query in every mode. It
also prints the cosines the floor is chosen from: the best stranger of each unanswerable
query and the relevant documents' own cosines (floor off). tests/integration/memory/
test_retrieval_set.py asserts the ranks and emptiness this prints, on the same data.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import httpx

DATA = Path(__file__).with_name("retrieval_set.json")
MODES = ("vector", "lexical", "hybrid")
CUTOFF = 5


@dataclass(frozen=True)
class Query:
    id: str
    query: str
    relevant: tuple[str, ...]


@dataclass(frozen=True)
class RetrievalSet:
    documents: list[dict[str, str]]
    queries: list[Query]

    @property
    def answerable(self) -> list[Query]:
        return [q for q in self.queries if q.relevant]

    @property
    def unanswerable(self) -> list[Query]:
        return [q for q in self.queries if not q.relevant]


def load_set(path: Path = DATA) -> RetrievalSet:
    raw = json.loads(path.read_text())
    queries = [Query(q["id"], q["query"], tuple(q["relevant"])) for q in raw["queries"]]
    return RetrievalSet(raw["documents"], queries)


async def store(
    client: httpx.AsyncClient, headers: dict[str, str], documents: Sequence[dict[str, str]]
) -> dict[str, str]:
    """Write every document as a fact (its id is the key); memory id -> document id. Each is a
    distinct fact of its subject, so each write says `new_key` (the write gate, docs/recall.md,
    would otherwise offer the subject's other keys)."""
    by_memory = {}
    for doc in documents:
        body = {
            "subject": doc["subject"],
            "kind": "fact",
            "key": doc["id"],
            "value": doc["value"],
            "new_key": True,
        }
        response = await client.post("/v1/memories", json=body, headers=headers)
        response.raise_for_status()
        by_memory[response.json()["memory"]["id"]] = doc["id"]
    return by_memory


@dataclass(frozen=True)
class Ranked:
    documents: list[str]
    scores: list[float]
    """Each hit's cosine (`score`)."""


async def rank_all(
    client: httpx.AsyncClient,
    headers: dict[str, str],
    queries: Sequence[Query],
    by_memory: dict[str, str],
    mode: str,
    *,
    k: int = 10,
    min_score: float | None = None,
) -> dict[str, Ranked]:
    """Each query's hits as document ids, best first."""
    out = {}
    for query in queries:
        body: dict[str, Any] = {"query": query.query, "k": k, "mode": mode}
        if min_score is not None:
            body["min_score"] = min_score
        response = await client.post("/v1/memories/search", json=body, headers=headers)
        response.raise_for_status()
        hits = response.json()["hits"]
        out[query.id] = Ranked(
            [by_memory[hit["memory"]["id"]] for hit in hits], [hit["score"] for hit in hits]
        )
    return out


@dataclass(frozen=True)
class Metrics:
    mrr: float
    recall_at_5: float
    ndcg_at_5: float
    empty_unanswerable: int
    """Unanswerable queries that came back with no hit."""
    unanswerable: int


def metrics(data: RetrievalSet, ranked: dict[str, Ranked]) -> Metrics:
    """Binary relevance; MRR, Recall@5 and NDCG@5 averaged over the answerable queries."""
    mrr = recall = ndcg = 0.0
    for query in data.answerable:
        docs, relevant = ranked[query.id].documents, set(query.relevant)
        first = next((i for i, doc in enumerate(docs) if doc in relevant), None)
        mrr += 0.0 if first is None else 1.0 / (first + 1)
        top = docs[:CUTOFF]
        recall += len(relevant & set(top)) / len(relevant)
        dcg = sum(1.0 / math.log2(i + 2) for i, doc in enumerate(top) if doc in relevant)
        ideal = sum(1.0 / math.log2(i + 2) for i in range(min(len(relevant), CUTOFF)))
        ndcg += dcg / ideal
    n = len(data.answerable)
    empty = sum(1 for q in data.unanswerable if not ranked[q.id].documents)
    return Metrics(mrr / n, recall / n, ndcg / n, empty, len(data.unanswerable))


async def floor_data(
    client: httpx.AsyncClient,
    headers: dict[str, str],
    data: RetrievalSet,
    by_memory: dict[str, str],
) -> tuple[float, float]:
    """(best stranger's cosine over the unanswerable queries, lowest cosine of a relevant
    document to its query), by cosine alone with the floor off."""
    ranked = await rank_all(
        client, headers, data.queries, by_memory, "vector", k=len(by_memory), min_score=0
    )
    strangers = [ranked[q.id].scores[0] for q in data.unanswerable if ranked[q.id].scores]
    relevant = [
        score
        for q in data.answerable
        for doc, score in zip(ranked[q.id].documents, ranked[q.id].scores, strict=True)
        if doc in q.relevant
    ]
    return max(strangers, default=0.0), min(relevant, default=1.0)


def first_relevant(query: Query, ranked: Ranked) -> int | None:
    """The 1-based rank of the query's first relevant hit (None: none came back)."""
    found = [i for i, doc in enumerate(ranked.documents) if doc in query.relevant]
    return found[0] + 1 if found else None


async def run(url: str, config: str | None, min_score: float | None, verbose: bool) -> None:
    from bench.api import agent_credentials, bearer, new_runtime
    from service.app import create_app

    runtime = await new_runtime(url)
    if config is not None:
        from dataclasses import replace

        memory = replace(runtime.settings.memory, text_search_config=config)
        runtime.settings = replace(runtime.settings, memory=memory)
    app = create_app(runtime)
    transport = httpx.ASGITransport(app=cast(Any, app))
    data = load_set()
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost:8080") as client:
        headers = await bearer(client, await agent_credentials(client, runtime))
        by_memory = await store(client, headers, data.documents)
        print(
            f"{len(data.documents)} documents, {len(data.answerable)} answerable queries, "
            f"{len(data.unanswerable)} unanswerable; text search config "
            f"{runtime.settings.memory.text_search_config}, floor "
            f"{'default' if min_score is None else min_score}"
        )
        print(f"{'mode':<8} {'MRR':>6} {'R@5':>6} {'NDCG@5':>7}  unanswerable empty")
        ranks: dict[str, dict[str, int | None]] = {}
        for mode in MODES:
            ranked = await rank_all(
                client, headers, data.queries, by_memory, mode, min_score=min_score
            )
            ranks[mode] = {q.id: first_relevant(q, ranked[q.id]) for q in data.answerable}
            m = metrics(data, ranked)
            print(
                f"{mode:<8} {m.mrr:6.3f} {m.recall_at_5:6.3f} {m.ndcg_at_5:7.3f}  "
                f"{m.empty_unanswerable}/{m.unanswerable}"
            )
        if verbose:
            for q in data.answerable:
                row = " ".join(f"{mode}={ranks[mode][q.id]}" for mode in MODES)
                print(f"  {q.id} {row}  {q.query}")
        stranger, weakest = await floor_data(client, headers, data, by_memory)
        print(f"best stranger cosine {stranger:.3f}; weakest relevant cosine {weakest:.3f}")
    await runtime.close()


def main() -> None:
    from bench.database import bench_database

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default=None, help="text search configuration")
    parser.add_argument("--min-score", type=float, default=None)
    parser.add_argument("--verbose", action="store_true", help="each query's first relevant rank")
    args = parser.parse_args()
    with bench_database() as url:
        asyncio.run(run(url, args.config, args.min_score, args.verbose))


if __name__ == "__main__":
    main()
