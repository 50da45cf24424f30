"""`embeddings.reembed` (issue 13): after a model change every version gets a vector of the
configured model, recorded per row; a run interrupted half-way resumes from its cursor to the
same result; searches during a half-done run answer correctly (a vector leg compares only
vectors of the query's model, the rest is found by its words); a model of another dimension is
refused; a job principal without grants does nothing."""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import text

from service.calls import Call, Facts
from service.embeddings import model_tag
from service.embeddings.base import EmbeddingDimensionsMismatch
from service.embeddings.jobs import REEMBED_JOB
from service.jobs.declare import RunScope
from service.memory.schemas import SearchMode, SearchRequest, SearchResult
from service.memory.service import MemoryService
from service.runtime import Runtime
from tests.fixtures.api import Agent, Api
from tests.integration.jobs.batch_support import (
    RenamedModel,
    agent_principal,
    job_principal,
    run_all,
    run_batch,
)
from tests.integration.memory.support import as_owner

FACTS = {
    "deploy.window": "Deploys happen on Tuesdays after the standup",
    "oncall": "The oncall engineer rotates every Monday morning",
    "budget": "The quarterly budget review is in March",
    "canteen": "The canteen serves lentil soup on Fridays",
    "parking": "Visitors park in lot B near the north entrance",
    "vpn": "The VPN certificate expires every ninety days",
}


async def _written(api: Api) -> tuple[Agent, dict[str, str]]:
    alice = await api.new_agent("alice")
    ids = {}
    for key, value in FACTS.items():
        ids[key] = (await api.remember(alice, key=key, value=value))["id"]
    # A superseded version too: time travel ranks old versions, so they are re-embedded.
    ids["deploy.window.v2"] = (
        await api.remember(alice, key="deploy.window", value="Deploys happen on Wednesdays now")
    )["id"]
    return alice, ids


async def _models(api: Api) -> dict[str, tuple[str, list[float]]]:
    """By id: (embedding_model, vector) as stored."""
    async with as_owner(api.runtime) as conn:
        found = await conn.execute(
            text("SELECT id::text, embedding_model, embedding::text FROM memories")
        )
        return {row[0]: (row[1], json.loads(row[2])) for row in found.all()}


def _switched(runtime: Runtime, model: Any) -> Runtime:
    """The same deployment after its embedding model changed."""
    return replace(runtime, embedder=model)


async def _search(
    runtime: Runtime, api: Api, alice: Agent, query: str, mode: SearchMode
) -> SearchResult:
    caller = agent_principal(api, alice)
    call = Call(runtime, "memory.search", "POST", "/t", caller=caller)
    try:
        service = MemoryService(call.db, runtime.embedder, runtime.settings.memory, facts=Facts())
        return await service.search(caller, SearchRequest(query=query, k=3, mode=mode))
    finally:
        await call.db.rollback()
        await call.close()


def _close(a: list[float], b: list[float]) -> bool:
    return all(abs(x - y) < 1e-5 for x, y in zip(a, b, strict=True))


async def test_a_run_reembeds_every_version_and_records_the_model(api: Api) -> None:
    alice, ids = await _written(api)
    old = await _models(api)
    assert {model for model, _ in old.values()} == {model_tag(api.runtime.embedder)}
    renamed = RenamedModel(api.runtime.embedder)
    switched = _switched(api.runtime, renamed)
    job = job_principal(api, alice.principal_id)
    scope = RunScope(uuid.UUID(api.tenant_id))

    counts, batches = await run_all(switched, REEMBED_JOB, job, scope, size=3)
    assert counts == {"stale": 7, "reembedded": 7}
    assert batches == 3
    new = await _models(api)
    assert set(new) == set(old)
    for memory_id, (model, vector) in new.items():
        assert model == "test/reversed@256"
        assert _close(vector, list(reversed(old[memory_id][1])))
    # Nothing left: a second run finds no stale row.
    again, _ = await run_all(switched, REEMBED_JOB, job, scope, size=3)
    assert again == {"stale": 0}
    # Rows are updated in place: no version was added.
    versions = (
        await api.http.get(f"/v1/memories/{ids['deploy.window.v2']}", headers=alice.headers)
    ).json()
    assert versions["version"] == 2


async def test_an_interrupted_run_resumes_from_its_cursor_to_the_same_result(api: Api) -> None:
    alice, _ = await _written(api)
    old = await _models(api)
    job = job_principal(api, alice.principal_id)
    scope = RunScope(uuid.UUID(api.tenant_id))
    failing = RenamedModel(api.runtime.embedder)
    failing.fail_on_call = 2  # the provider dies during the second batch
    switched = _switched(api.runtime, failing)

    first = await run_batch(switched, REEMBED_JOB, job, scope, size=3)
    assert first.counts == {"stale": 3, "reembedded": 3}
    assert first.cursor is not None
    with pytest.raises(RuntimeError):
        await run_batch(switched, REEMBED_JOB, job, scope, cursor=first.cursor, size=3)
    half = await _models(api)
    assert sum(model == "test/reversed@256" for model, _ in half.values()) == 3  # rolled back

    # Another process resumes the run from the saved cursor.
    resumed = _switched(api.runtime, RenamedModel(api.runtime.embedder))
    counts, _ = await run_all(resumed, REEMBED_JOB, job, scope, size=3, cursor=first.cursor)
    assert counts == {"stale": 4, "reembedded": 4}
    done = await _models(api)
    assert all(model == "test/reversed@256" for model, _ in done.values())
    for memory_id, (_, vector) in done.items():
        assert _close(vector, list(reversed(old[memory_id][1])))  # as an unbroken run


async def test_search_during_a_half_done_run_answers_correctly(api: Api) -> None:
    alice, ids = await _written(api)
    job = job_principal(api, alice.principal_id)
    switched = _switched(api.runtime, RenamedModel(api.runtime.embedder))
    # Re-embed only the first three rows by id.
    half = await run_batch(switched, REEMBED_JOB, job, RunScope(uuid.UUID(api.tenant_id)), size=3)
    assert half.cursor is not None
    models = await _models(api)
    fresh = {i for i, (m, _) in models.items() if m == "test/reversed@256"}
    live = {key: memory_id for key, memory_id in ids.items() if key != "deploy.window"}
    stale_live = {k: i for k, i in live.items() if i not in fresh}
    fresh_live = {k: i for k, i in live.items() if i in fresh}
    assert stale_live
    assert fresh_live

    for key, memory_id in live.items():
        value = FACTS.get(key, "Deploys happen on Wednesdays now")
        # Hybrid: every live memory is found by its own words, whichever model embedded it.
        found = await _search(switched, api, alice, value, "hybrid")
        top = found.hits[0]
        assert str(top.memory.id) == memory_id, (key, found.hits)
        assert top.lexical_score is not None
        assert top.lexical_score > 0.5
        if memory_id in fresh:
            assert top.score is not None
            assert top.score > 0.99
        else:
            assert top.score is None  # no cosine across two models
        # Vector mode ranks only rows of the query's model: never a stale row.
        vector = await _search(switched, api, alice, value, "vector")
        assert {str(hit.memory.id) for hit in vector.hits} <= fresh
        assert all(hit.score is not None for hit in vector.hits)

    # Through the API of a replica still on the old model (api.http): a re-embedded row is
    # the "other model" there, found by its words with `score: null` in the JSON answer.
    for key, memory_id in fresh_live.items():
        value = FACTS.get(key, "Deploys happen on Wednesdays now")
        response = await api.search(alice, value, k=3)
        assert response.status_code == 200, response.text
        top = response.json()["hits"][0]
        assert top["memory"]["id"] == memory_id
        assert top["score"] is None
        assert top["lexical_score"] > 0.5

    # The old deployment (a replica not yet restarted) searches its own model's rows the same way.
    for key, memory_id in stale_live.items():
        value = FACTS.get(key, "Deploys happen on Wednesdays now")
        old = await _search(api.runtime, api, alice, value, "hybrid")
        assert str(old.hits[0].memory.id) == memory_id
        assert old.hits[0].score is not None
        assert old.hits[0].score > 0.99


async def test_no_transaction_waits_for_the_provider(api: Api) -> None:
    """While the provider answers, no connection of the app is idle in a transaction."""
    alice, _ = await _written(api)
    model = RenamedModel(api.runtime.embedder)
    waiting: list[int] = []

    async def look() -> None:
        async with as_owner(api.runtime) as conn:
            found = await conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND state LIKE 'idle in transaction%' AND pid <> pg_backend_pid()"
                )
            )
            waiting.append(int(found.scalar_one()))

    model.while_asked = look
    counts, _ = await run_all(
        _switched(api.runtime, model),
        REEMBED_JOB,
        job_principal(api, alice.principal_id),
        RunScope(uuid.UUID(api.tenant_id)),
        size=3,
    )
    assert counts["reembedded"] == 7
    assert waiting == [0, 0, 0]


async def test_a_dry_run_counts_and_changes_nothing(api: Api) -> None:
    alice, _ = await _written(api)
    before = await _models(api)
    switched = _switched(api.runtime, RenamedModel(api.runtime.embedder))
    scope = RunScope(uuid.UUID(api.tenant_id), dry_run=True)
    counts, _ = await run_all(switched, REEMBED_JOB, job_principal(api, alice.principal_id), scope)
    assert counts == {"stale": 7}
    assert await _models(api) == before


async def test_a_model_of_another_dimension_is_refused(api: Api) -> None:
    alice, _ = await _written(api)
    before = await _models(api)
    wide = _switched(api.runtime, RenamedModel(api.runtime.embedder, dimensions=384))
    with pytest.raises(EmbeddingDimensionsMismatch) as refused:
        await run_batch(
            wide,
            REEMBED_JOB,
            job_principal(api, alice.principal_id),
            RunScope(uuid.UUID(api.tenant_id)),
        )
    assert "384" in refused.value.detail
    assert "256" in refused.value.detail
    assert refused.value.status == 409
    assert await _models(api) == before


async def test_a_job_principal_without_grants_does_nothing(api: Api) -> None:
    """Another principal, one with no grant at all, and another tenant's job naming Alice's
    principal id: none of them sees a row, so none is re-embedded."""
    alice, _ = await _written(api)
    before = await _models(api)
    bob = await api.new_principal("bob")
    other = await api.other_tenant()
    switched = _switched(api.runtime, RenamedModel(api.runtime.embedder))
    for principal in (
        job_principal(api, bob["id"]),
        job_principal(api, uuid.uuid4()),
        job_principal(other, alice.principal_id),  # another tenant's job naming Alice's id
    ):
        counts, _ = await run_all(switched, REEMBED_JOB, principal, RunScope(principal.tenant_id))
        assert counts == {"stale": 0}
    assert await _models(api) == before
