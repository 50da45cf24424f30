"""The one door every embedding call of the app goes through: a span and a latency sample,
labelled with the provider/model id only (never the texts)."""

from __future__ import annotations

from collections.abc import Sequence

from service.embeddings.base import Embedder
from service.observability.telemetry import EMBEDDING_DURATION, span, timed


class TracedEmbedder:
    def __init__(self, inner: Embedder) -> None:
        self._inner = inner

    @property
    def model_id(self) -> str:
        return self._inner.model_id

    @property
    def dimensions(self) -> int:
        return self._inner.dimensions

    @property
    def remote(self) -> bool:
        return self._inner.remote

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        model = {"memgate.embedding.model": self._inner.model_id}
        with (
            span("embedding.embed", {**model, "memgate.embedding.count": len(texts)}),
            timed(EMBEDDING_DURATION, model),
        ):
            return await self._inner.embed(texts)


def traced_embedder(embedder: Embedder) -> Embedder:
    """`embedder` behind a TracedEmbedder (once: wrapping a wrapped one returns it as is)."""
    return embedder if isinstance(embedder, TracedEmbedder) else TracedEmbedder(embedder)
