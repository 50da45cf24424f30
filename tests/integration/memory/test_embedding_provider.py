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

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
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
