"""The provider protocol and the checks every vector passes before it reaches the database."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

from service.problems import Problem


class EmbeddingInvalid(
    Problem, slug="embedding-invalid", status=502, title="Embedding provider answered badly"
):
    """The provider returned vectors of the wrong dimension, count, or with NaN/inf values."""


class EmbeddingFailed(
    Problem, slug="embedding-unavailable", status=503, title="Embedding provider unavailable"
):
    """The provider could not be reached or kept failing after retries; retry later."""

    def headers(self) -> dict[str, str]:
        return {"Retry-After": "5"}


class Embedder(Protocol):
    @property
    def model_id(self) -> str:
        """`provider/model`, recorded on every row it embedded."""
        ...

    @property
    def dimensions(self) -> int: ...

    async def embed(self, texts: Sequence[str]) -> list[list[float]]: ...


def check_vectors(
    vectors: Sequence[Sequence[float]], expected: int, dims: int
) -> list[list[float]]:
    if len(vectors) != expected:
        raise EmbeddingInvalid(
            f"The embedding provider returned {len(vectors)} vectors for {expected} inputs."
        )
    checked: list[list[float]] = []
    for vector in vectors:
        if len(vector) != dims:
            raise EmbeddingInvalid(
                f"The embedding provider returned a {len(vector)}-dimensional vector; the schema "
                f"stores {dims}. Configure a {dims}-dimensional model. Nothing was written."
            )
        values = [float(v) for v in vector]
        if not all(math.isfinite(v) for v in values):
            raise EmbeddingInvalid("The embedding provider returned NaN or infinite values.")
        checked.append(values)
    return checked
