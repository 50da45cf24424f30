"""WordLlama `l2_supercat` (256 dims): weights and tokenizer ship in the wheel, so it loads
offline. `WordLlama.load()` would try to download the tokenizer unless pointed at the package."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

from service.embeddings.base import check_vectors

INLINE_CHARS = 2048
_LONG_TEXTS = anyio.CapacityLimiter(2)


class WordLlamaEmbedder:
    def __init__(self, model: str = "l2_supercat", dimensions: int = 256) -> None:
        import wordllama

        package_dir = Path(wordllama.__file__).parent
        self._model: Any = wordllama.WordLlama.load(
            config=model, dim=dimensions, cache_dir=package_dir, disable_download=True
        )
        self._name = model
        self._dimensions = dimensions

    @property
    def model_id(self) -> str:
        return f"wordllama/{self._name}"

    @property
    def dimensions(self) -> int:
        return self._dimensions

    @property
    def remote(self) -> bool:
        return False  # in process: a fraction of a millisecond of CPU

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        # Tens of microseconds for a query or a typical memory: cheaper inline than a thread hop.
        # A long text (16k characters of emoji tokenize slowly) would stall every other request
        # on the event loop for ~0.1 s, so long batches go to a worker thread.
        batch = list(texts)
        if sum(len(text) for text in batch) <= INLINE_CHARS:
            vectors = self._encode(batch)
        else:
            vectors = await anyio.to_thread.run_sync(self._encode, batch, limiter=_LONG_TEXTS)
        return check_vectors(vectors, len(batch), self._dimensions)

    def _encode(self, texts: list[str]) -> list[list[float]]:
        vectors: list[list[float]] = self._model.embed(texts, norm=True, return_np=True).tolist()
        return vectors
