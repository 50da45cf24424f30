"""A provider that answers vectors the schema cannot store (wrong dimension, NaN) gives 502
`embedding-invalid` and writes nothing. The provider is a local fake behind httpx.MockTransport;
the database, tokens and policy are real."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import httpx
import pytest
from litestar.testing import AsyncTestClient

from service.app import create_app
from service.embeddings.http import HttpEmbedder
from service.runtime import build_runtime
from service.settings import Settings
from tests.conftest import PUBLIC_URL
from tests.fixtures.api import Api
from tests.fixtures.postgres import app_login
from tests.integration.memory.support import assert_problem, count_memories

Vectorizer = Callable[[int], list[float]]


@dataclass
class FakeProvider:
    """An OpenAI-compatible /v1/embeddings endpoint whose vectors the test chooses."""

    vector: Vectorizer
    calls: int = 0
    raw: Callable[[], object] | None = None
    """When set, the whole JSON body to answer, whatever was asked."""

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        if self.raw is not None:
            return httpx.Response(200, content=json.dumps(self.raw()).encode())
        texts = json.loads(request.content)["input"]
        data = [
            {"object": "embedding", "index": i, "embedding": self.vector(i)}
            for i in range(len(texts))
        ]
        # json.dumps writes NaN literally, as a careless provider would.
        return httpx.Response(200, content=json.dumps({"data": data}).encode())


def _good(_: int) -> list[float]:
    return [1.0] + [0.0] * 255


@pytest.fixture
def provider() -> FakeProvider:
    return FakeProvider(_good)


@pytest.fixture
async def provider_api(settings: Settings, provider: FakeProvider) -> AsyncIterator[Api]:
    embedder = HttpEmbedder(
        flavor="openai",
        base_url="http://embeddings.invalid",
        model="fake-256",
        dimensions=256,  # what it claims; build_runtime refuses anything else at start
        retries=0,
        transport=httpx.MockTransport(provider.handle),
    )
    runtime = await build_runtime(
        settings, app_login(settings.database.url), embedder, owner_url=settings.database.url
    )
    try:
        async with AsyncTestClient(app=create_app(runtime), base_url=PUBLIC_URL) as http:
            yield await Api.bootstrap(http, runtime)
    finally:
        await runtime.close()
        await embedder.aclose()


async def test_a_working_provider_writes(provider_api: Api, provider: FakeProvider) -> None:
    alice = await provider_api.new_agent("alice")
    assert provider.calls == 1  # the start-up probe
    memory = await provider_api.remember(alice, key="deploy.window", value="friday")
    assert memory["provenance"]["embedding_model"] == "openai/fake-256@256"
    assert provider.calls == 2
    assert await count_memories(provider_api.runtime) == 1


@pytest.mark.parametrize(
    ("name", "vector"),
    [
        ("255-dims", lambda _: [0.1] * 255),
        ("257-dims", lambda _: [0.1] * 257),
        ("nan", lambda _: [math.nan] + [0.1] * 255),
        ("infinity", lambda _: [math.inf] + [0.1] * 255),
    ],
)
async def test_bad_vectors_are_502_and_write_nothing(
    provider_api: Api, provider: FakeProvider, name: str, vector: Vectorizer
) -> None:
    alice = await provider_api.new_agent("alice")
    kept = await provider_api.remember(alice, key="kept", value="written while the provider worked")
    provider.vector = vector
    before = await count_memories(provider_api.runtime)

    response = await provider_api.http.post(
        "/v1/memories",
        json={"subject": "service:billing", "kind": "fact", "key": "deploy.window", "value": "x"},
        headers=alice.headers,
    )
    problem = assert_problem(response, 502, "embedding-invalid")
    if name.endswith("dims"):
        assert name.split("-", maxsplit=1)[0] in problem["detail"]
        assert "256" in problem["detail"]
    else:
        assert "NaN" in problem["detail"] or "infinite" in problem["detail"]
    assert await count_memories(provider_api.runtime) == before

    # Superseding a live key fails the same way and leaves the live version alone.
    response = await provider_api.http.post(
        "/v1/memories",
        json={"subject": "service:billing", "kind": "fact", "key": "kept", "value": "y"},
        headers=alice.headers,
    )
    assert_problem(response, 502, "embedding-invalid")
    still = await provider_api.http.get(f"/v1/memories/{kept['id']}", headers=alice.headers)
    assert still.status_code == 200
    assert still.json()["status"] == "live"
    assert still.json()["superseded_by"] is None
    assert await count_memories(provider_api.runtime) == before

    search = await provider_api.search(alice, "deploy window")
    assert_problem(search, 502, "embedding-invalid")


def _one(embedding: object) -> dict[str, object]:
    return {"data": [{"object": "embedding", "index": 0, "embedding": embedding}]}


_UNIT = [1.0] + [0.0] * 255

# Answers an untrusted provider may give that are not one usable vector per input: wrong JSON
# types at every level, a vector cosine cannot compare (zero length, or one whose length
# overflows or vanishes in the single precision pgvector computes in), and values beyond what
# a `vector` column can hold (float4).
MALFORMED: dict[str, object] = {
    "vector-is-object": _one({"x": 1.0}),
    "vector-is-string": _one("0.1" * 256),
    "vector-is-null": _one(None),
    "vector-is-scalar": _one(0.5),
    "elements-are-strings": _one(["0.1"] * 256),
    "elements-are-null": _one([None] * 256),
    "elements-are-booleans": _one([True] * 256),
    "elements-are-lists": _one([[0.1]] * 256),
    "element-is-object": _one([{"v": 1}] + [0.1] * 255),
    "zero-vector": _one([0.0] * 256),
    "float4-overflow": _one([1e39] + [0.1] * 255),
    "norm-overflows-float4": _one([1e20] * 256),
    "norm-vanishes-in-float4": _one([1e-30] * 256),
    "data-is-object": {"data": {"0": _UNIT}},
    "data-is-null": {"data": None},
    "item-is-list": {"data": [_UNIT]},
    "index-is-string": {"data": [{"index": "0", "embedding": _UNIT}]},
    "index-is-boolean": {"data": [{"index": False, "embedding": _UNIT}]},
    "index-out-of-range": {"data": [{"index": 3, "embedding": _UNIT}]},
    "body-is-list": [_UNIT],
    "body-is-null": None,
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
async def test_malformed_provider_answers_are_502_and_change_nothing(
    provider_api: Api, provider: FakeProvider, name: str
) -> None:
    """Every malformed answer is the provider's fault (502 `embedding-invalid`, never a 500 or
    a 422 blamed on the caller), for writes and searches alike, and nothing is written."""
    alice = await provider_api.new_agent("alice")
    kept = await provider_api.remember(alice, key="kept", value="written while the provider worked")
    before = await count_memories(provider_api.runtime)
    provider.raw = lambda: MALFORMED[name]

    for key in ("fresh.key", "kept"):  # a new key, and a new version of a live one
        response = await provider_api.http.post(
            "/v1/memories",
            json={"subject": "service:billing", "kind": "fact", "key": key, "value": "y"},
            headers=alice.headers,
        )
        problem = assert_problem(response, 502, "embedding-invalid")
        assert "Nothing was written" in problem["detail"] or "nothing" in problem["detail"]
    assert await count_memories(provider_api.runtime) == before
    still = await provider_api.http.get(f"/v1/memories/{kept['id']}", headers=alice.headers)
    assert still.json()["status"] == "live"
    assert still.json()["superseded_by"] is None

    search = await provider_api.search(alice, "written")
    assert_problem(search, 502, "embedding-invalid")


async def test_scores_are_numbers_for_the_vectors_that_are_accepted(
    provider_api: Api, provider: FakeProvider
) -> None:
    """Large and small but usable lengths are accepted, and every score is a finite number."""
    alice = await provider_api.new_agent("alice")
    for i, scale in enumerate((1e-12, 1.0, 1e12)):
        provider.vector = lambda _, s=scale: [s] + [s / 2] * 255  # type: ignore[misc]
        await provider_api.remember(alice, key=f"k{i}", value=f"value {i}")
    provider.vector = _good
    hits = (await provider_api.search(alice, "value")).json()["hits"]
    assert len(hits) == 3
    assert all(isinstance(hit["score"], float) and math.isfinite(hit["score"]) for hit in hits)
