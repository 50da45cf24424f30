"""WordLlama `l2_supercat` (256 dims): weights and tokenizer ship in the wheel, so it loads
offline. `WordLlama.load()` would try to download the tokenizer unless pointed at the package."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from service.embeddings.base import check_vectors


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

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        # Tens of microseconds per text: cheaper inline than a thread hop.
        vectors = self._model.embed(list(texts), norm=True, return_np=True)
        return check_vectors(vectors.tolist(), len(texts), self._dimensions)
