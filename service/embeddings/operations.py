"""The embeddings feature's operations: jobs only (no route or tool of their own)."""

from __future__ import annotations

from service.auth.scopes import Scope
from service.embeddings.base import EmbeddingDimensionsMismatch, EmbeddingFailed, EmbeddingInvalid
from service.operations import operation
from service.problems import BadCursor

REEMBED = operation(
    "embeddings.reembed",
    "reembedMemories",
    "Re-embed the memories whose vectors another embedding model made",
    Scope.RUN_JOBS,
    BadCursor,
    EmbeddingDimensionsMismatch,
    EmbeddingInvalid,
    EmbeddingFailed,
)
