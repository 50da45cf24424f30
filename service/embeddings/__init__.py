"""Embedding providers behind one protocol; WordLlama (offline) is the default."""

from service.embeddings.base import (
    Embedder,
    EmbeddingFailed,
    EmbeddingInvalid,
    check_vectors,
    model_tag,
)
from service.embeddings.factory import create_embedder
from service.embeddings.traced import TracedEmbedder, traced_embedder

__all__ = [
    "Embedder",
    "EmbeddingFailed",
    "EmbeddingInvalid",
    "TracedEmbedder",
    "check_vectors",
    "create_embedder",
    "model_tag",
    "traced_embedder",
]
