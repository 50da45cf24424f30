"""Build the configured provider."""

from __future__ import annotations

from service.embeddings.base import Embedder
from service.settings import EmbeddingSettings


def create_embedder(settings: EmbeddingSettings) -> Embedder:
    if settings.provider == "wordllama":
        from service.embeddings.wordllama import WordLlamaEmbedder

        return WordLlamaEmbedder(settings.model, settings.dimensions)
    if settings.provider in {"ollama", "openai"}:
        from service.embeddings.http import HttpEmbedder

        return HttpEmbedder(
            flavor=settings.provider,
            base_url=settings.base_url,
            model=settings.model,
            dimensions=settings.dimensions,
            api_key=settings.api_key,
            timeout=settings.timeout_seconds,
            retries=settings.retries,
        )
    raise ValueError(
        f"MEMGATE_EMBEDDING_PROVIDER {settings.provider!r} is not one of wordllama, ollama, openai"
    )
