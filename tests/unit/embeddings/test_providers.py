"""HTTP providers against a local fake (httpx.MockTransport): shapes, retries, checks."""

from __future__ import annotations

import asyncio
import gzip
import json
import math
import threading
import time
from collections.abc import AsyncIterator

import httpx
import pytest

from service.embeddings import EmbeddingFailed, EmbeddingInvalid
from service.embeddings.http import HttpEmbedder
from service.embeddings.wordllama import INLINE_CHARS, WordLlamaEmbedder
from service.runtime import check_embedder
from service.settings import EmbeddingSettings, SummarizerSettings


def _embedder(flavor: str, handler: httpx.MockTransport, dims: int = 4) -> HttpEmbedder:
    return HttpEmbedder(
        flavor=flavor,
        base_url="http://embed.local",
        model="m",
        dimensions=dims,
        retries=2,
        transport=handler,
    )


async def test_ollama_shape_and_model_id() -> None:
    seen: list[dict[str, object]] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append({"path": request.url.path, **json.loads(request.content)})
        return httpx.Response(200, json={"embeddings": [[1, 0, 0, 0], [0, 1, 0, 0]]})

    embedder = _embedder("ollama", httpx.MockTransport(handle))
    assert await embedder.embed(["a", "b"]) == [[1.0, 0, 0, 0], [0, 1.0, 0, 0]]
    assert seen == [{"path": "/api/embed", "model": "m", "input": ["a", "b"]}]
    assert embedder.model_id == "ollama/m"


async def test_openai_shape_is_reordered_by_index() -> None:
    def handle(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/embeddings"
        data = [{"index": 1, "embedding": [0, 1, 0, 0]}, {"index": 0, "embedding": [1, 0, 0, 0]}]
        return httpx.Response(200, json={"data": data})

    embedder = _embedder("openai", httpx.MockTransport(handle))
    assert await embedder.embed(["a", "b"]) == [[1.0, 0, 0, 0], [0, 1.0, 0, 0]]


async def test_transient_failures_are_retried_then_succeed() -> None:
    calls = 0

    def handle(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if calls < 3:
            return httpx.Response(503)
        return httpx.Response(200, json={"embeddings": [[1, 2, 3, 4]]})

    assert await _embedder("ollama", httpx.MockTransport(handle)).embed(["a"]) == [[1, 2, 3, 4]]
    assert calls == 3


async def test_persistent_failure_becomes_a_503_problem() -> None:
    calls = 0

    def handle(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        raise httpx.ConnectError("refused", request=request)

    with pytest.raises(EmbeddingFailed) as caught:
        await _embedder("ollama", httpx.MockTransport(handle)).embed(["a"])
    assert calls == 3
    assert caught.value.status == 503


async def test_client_errors_are_not_retried() -> None:
    calls = 0

    def handle(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return httpx.Response(400, json={"error": "bad model"})

    with pytest.raises(EmbeddingFailed):
        await _embedder("ollama", httpx.MockTransport(handle)).embed(["a"])
    assert calls == 1


@pytest.mark.parametrize(
    "vectors",
    [[[1, 2, 3]], [[1, 2, 3, 4, 5]], [[1, 2, math.nan, 4]], [[1, 2, 3, 4], [1, 2, 3, 4]], []],
    ids=["short", "long", "nan", "too-many", "none"],
)
async def test_bad_vectors_are_refused(vectors: list[list[float]]) -> None:
    def handle(request: httpx.Request) -> httpx.Response:
        body = json.dumps({"embeddings": vectors}, allow_nan=True)
        return httpx.Response(200, content=body.encode())

    with pytest.raises(EmbeddingInvalid) as caught:
        await _embedder("ollama", httpx.MockTransport(handle)).embed(["a"])
    assert caught.value.status == 502


async def test_wordllama_loads_offline_and_normalizes() -> None:
    embedder = WordLlamaEmbedder()
    [vector] = await embedder.embed(["deploy window is friday"])
    assert len(vector) == 256
    assert math.isclose(math.fsum(v * v for v in vector), 1.0, rel_tol=1e-4)
    await check_embedder(embedder)


async def test_a_model_of_another_dimension_refuses_to_start() -> None:
    embedder = HttpEmbedder(flavor="openai", base_url="http://x", model="big", dimensions=384)
    with pytest.raises(SystemExit, match="384 dimensions"):
        await check_embedder(embedder)


async def test_a_provider_serving_another_model_than_configured_refuses_to_start() -> None:
    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"embeddings": [[0.1] * 768]})

    embedder = _embedder("ollama", httpx.MockTransport(handle), dims=256)
    with pytest.raises(SystemExit, match="768-dimensional"):
        await check_embedder(embedder)


async def test_an_unreachable_provider_refuses_to_start() -> None:
    def handle(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    with pytest.raises(SystemExit, match="start-up probe"):
        await check_embedder(_embedder("ollama", httpx.MockTransport(handle), dims=256))


async def test_long_texts_are_embedded_off_the_event_loop() -> None:
    """Red-team round 2, F8: a 16k-character value would otherwise stall every request."""
    seen: list[str] = []

    class Recording(WordLlamaEmbedder):
        def _encode(self, texts: list[str]) -> list[list[float]]:
            seen.append(threading.current_thread().name)
            return super()._encode(texts)

    embedder = Recording()
    await embedder.embed(["short query"])
    await embedder.embed(["🙂" * (INLINE_CHARS + 1)])
    main = threading.main_thread().name
    assert seen[0] == main
    assert seen[1] != main


async def _endless(chunk: bytes, pause: float) -> AsyncIterator[bytes]:
    """An answer body that never ends: `chunk` after `pause`, for ever."""
    while True:
        await asyncio.sleep(pause)
        yield chunk


def _endless_answer(chunk: bytes, pause: float) -> httpx.MockTransport:
    return httpx.MockTransport(lambda _: httpx.Response(200, content=_endless(chunk, pause)))


async def test_a_huge_answer_is_refused_before_it_is_held_whole() -> None:
    """Issue 18, unsafe consumption: the body is read in chunks and dropped past what vectors
    of this dimension can take (before, an endless body was read until memory ran out)."""
    embedder = _embedder("ollama", _endless_answer(b"9" * 65536, 0))
    async with asyncio.timeout(10):
        with pytest.raises(EmbeddingInvalid, match="larger than vectors of 4 dimensions"):
            await embedder.embed(["a"])


async def test_a_trickling_provider_is_cut_off_at_the_attempts_time() -> None:
    """Issue 18: a provider sending a byte every 50 ms never trips httpx's timeout (it bounds
    each read); each attempt, body included, now ends within the configured timeout."""
    embedder = HttpEmbedder(
        flavor="ollama",
        base_url="http://embed.local",
        model="m",
        dimensions=4,
        timeout=0.3,
        retries=1,
        transport=_endless_answer(b" ", 0.05),
    )
    began = time.monotonic()
    async with asyncio.timeout(10):
        with pytest.raises(EmbeddingFailed, match="unreachable or keeps failing"):
            await embedder.embed(["a"])
    assert time.monotonic() - began < 2.0  # two attempts of 0.3 s and a 0.2 s backoff


async def test_a_compressed_answer_is_refused_unread() -> None:
    """Issue 18: memgate asks for an uncompressed answer; a gzip body (a bomb inflates a
    thousandfold, chunk by chunk, before any size check) is refused, not inflated."""
    bomb = gzip.compress(b"0" * 10_000_000)
    seen: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("accept-encoding", ""))
        return httpx.Response(200, content=bomb, headers={"Content-Encoding": "gzip"})

    with pytest.raises(EmbeddingInvalid, match="answered compressed"):
        await _embedder("ollama", httpx.MockTransport(handle)).embed(["a"])
    assert seen == ["identity"]


async def test_a_deeply_nested_answer_is_refused_not_a_500() -> None:
    """Red team (issue 18): `[` x 60,000 fits the size bound and blew the JSON parser's
    recursion limit: a RecursionError, so a write or search answered 500."""
    nested = httpx.MockTransport(lambda _: httpx.Response(200, content=b"[" * 60_000))
    with pytest.raises(EmbeddingInvalid, match="non-JSON"):
        await _embedder("ollama", nested, dims=256).embed(["a"])


@pytest.mark.parametrize(
    ("timeout", "retries"), [(math.inf, 2), (0.0, 2), (61.0, 2), (10.0, 6), (10.0, -1)]
)
def test_provider_settings_bound_how_long_a_call_can_wait(timeout: float, retries: int) -> None:
    """Red team (issue 18): MEMGATE_EMBEDDING_TIMEOUT=inf (or a large retry count) was taken,
    and a stuck provider could hold every write and search that long. The summarizer's
    timeout had no upper bound either."""
    with pytest.raises(ValueError, match="MEMGATE_EMBEDDING"):
        EmbeddingSettings(timeout_seconds=timeout, retries=retries)
    with pytest.raises(ValueError, match="MEMGATE_SUMMARIZER"):
        SummarizerSettings(
            timeout_seconds=math.inf if timeout == 61.0 else timeout, retries=retries
        )
