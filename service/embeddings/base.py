"""The provider protocol and the checks every vector passes before it reaches the database."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

from service.problems import Problem


class EmbeddingInvalid(
    Problem, slug="embedding-invalid", status=502, title="Embedding provider answered badly"
):
    """The provider's answer is not one usable vector per input (wrong shape or JSON types,
    count, dimension, NaN/inf, beyond float4, or a length cosine cannot compare, such as a zero
    vector); nothing was written."""


class EmbeddingFailed(
    Problem, slug="embedding-unavailable", status=503, title="Embedding provider unavailable"
):
    """The provider could not be reached or kept failing after retries; retry later."""

    def headers(self) -> dict[str, str]:
        return {"Retry-After": "5"}


class EmbeddingDimensionsMismatch(
    Problem,
    slug="embedding-dimensions-mismatch",
    status=409,
    title="Embedding model does not fit the schema",
):
    """The configured embedding model makes vectors of another size than the schema's vector
    column: re-embedding cannot change the column, a migration must; nothing was changed."""


class Embedder(Protocol):
    @property
    def model_id(self) -> str:
        """`provider/model`, recorded on every row it embedded."""
        ...

    @property
    def dimensions(self) -> int: ...

    @property
    def remote(self) -> bool:
        """Whether it answers over the network: a call then holds no database connection in
        a transaction while it waits (service/memory/service.py)."""
        ...

    async def embed(self, texts: Sequence[str]) -> list[list[float]]: ...


def model_tag(embedder: Embedder) -> str:
    """What a row records as its `embedding_model`: `provider/model@dimensions`. A search's
    vector leg ranks only rows of the query's tag, and `embeddings.reembed` re-embeds the rows
    of any other."""
    return f"{embedder.model_id}@{embedder.dimensions}"


# pgvector stores float4 and computes cosine distance in single precision: an element beyond
# float4's range cannot be stored, and a vector whose squared length overflows or vanishes
# there has no cosine (distance NaN, a score of null). Bounds kept clear of float4's limits
# (3.4e38, 1.2e-38) so rounding cannot land a vector on the wrong side.
FLOAT4_MAX = 3.4028234663852886e38
MAX_SQUARED_NORM = 1e37
MIN_SQUARED_NORM = 1e-30


def check_vectors(vectors: object, expected: int, dims: int) -> list[list[float]]:
    """The provider's vectors, or `EmbeddingInvalid`: the provider is untrusted input, so every
    JSON type is checked (a list of `expected` lists of `dims` numbers, booleans excluded), and
    every vector must be one cosine can compare in the database."""
    if not isinstance(vectors, Sequence) or isinstance(vectors, str | bytes):
        raise EmbeddingInvalid(_nothing_written("did not return a list of vectors"))
    if len(vectors) != expected:
        raise EmbeddingInvalid(
            f"The embedding provider returned {len(vectors)} vectors for {expected} inputs. "
            "Nothing was written."
        )
    return [_checked(vector, dims) for vector in vectors]


def _checked(vector: object, dims: int) -> list[float]:
    if not isinstance(vector, Sequence) or isinstance(vector, str | bytes):
        raise EmbeddingInvalid(_nothing_written("returned a vector that is not a list"))
    if len(vector) != dims:
        raise EmbeddingInvalid(
            f"The embedding provider returned a {len(vector)}-dimensional vector; the schema "
            f"stores {dims}. Configure a {dims}-dimensional model. Nothing was written."
        )
    # bool is an int subclass: `true` is not a coordinate. numpy scalars (WordLlama) are
    # converted to float by `tolist()` before they get here.
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in vector):
        raise EmbeddingInvalid(_nothing_written("returned a vector with non-numeric values"))
    values = [float(v) for v in vector]
    if not all(math.isfinite(v) for v in values):
        raise EmbeddingInvalid(_nothing_written("returned NaN or infinite values"))
    if any(abs(v) > FLOAT4_MAX for v in values):
        raise EmbeddingInvalid(
            _nothing_written("returned values beyond single precision (|v| > 3.4e38)")
        )
    squared = math.fsum(v * v for v in values)
    if squared == 0.0:
        raise EmbeddingInvalid(
            _nothing_written("returned a zero vector, which has no cosine similarity")
        )
    if not MIN_SQUARED_NORM <= squared <= MAX_SQUARED_NORM:
        raise EmbeddingInvalid(
            _nothing_written(
                "returned a vector whose length cannot be compared in single precision "
                "(squared length outside 1e-30..1e37)"
            )
        )
    return values


def _nothing_written(what: str) -> str:
    return f"The embedding provider {what}. Nothing was written; check the provider."
