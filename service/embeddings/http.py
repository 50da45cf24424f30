"""HTTP embedding providers: Ollama (`/api/embed`) and OpenAI-compatible (`/v1/embeddings`),
with a time bound per attempt, a size bound on the answer, bounded retries on transient
failures (service/provider_calls.py), and the same vector checks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx

from service.embeddings.base import EmbeddingFailed, EmbeddingInvalid, check_vectors
from service.provider_calls import (
    ProviderAnswerInvalid,
    ProviderRefused,
    ProviderUnreachable,
    post_json,
)

BYTES_PER_NUMBER = 32
"""Generous for a float in JSON ("-0.12345678901234567e-05", and a separator)."""
ENVELOPE_BYTES = 64 * 1024
"""Room for the answer's own fields (model names, usage counts) around the vectors."""


_UNUSABLE = {
    "not-json": "The embedding provider returned non-JSON.",
    "too-large": (
        "The embedding provider's answer is larger than vectors of {dims} dimensions can be. "
        "Nothing was written."
    ),
    "compressed": (
        "The embedding provider answered compressed, though memgate asked for an "
        "uncompressed answer (Accept-Encoding: identity). Nothing was written."
    ),
}


def answer_bytes_max(texts: int, dimensions: int) -> int:
    """The largest answer a provider can honestly give for `texts` vectors of `dimensions`."""
    return ENVELOPE_BYTES + texts * dimensions * BYTES_PER_NUMBER


class HttpEmbedder:
    def __init__(
        self,
        *,
        flavor: str,
        base_url: str,
        model: str,
        dimensions: int,
        api_key: str = "",
        timeout: float = 10.0,
        retries: int = 2,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if flavor not in {"ollama", "openai"}:
            raise ValueError(f"unknown HTTP embedding provider {flavor!r}")
        self._flavor = flavor
        self._model = model
        self._dimensions = dimensions
        self._retries = retries
        self._timeout = timeout
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.AsyncClient(
            base_url=base_url.rstrip("/"), timeout=timeout, headers=headers, transport=transport
        )

    @property
    def model_id(self) -> str:
        return f"{self._flavor}/{self._model}"

    @property
    def dimensions(self) -> int:
        return self._dimensions

    @property
    def remote(self) -> bool:
        return True

    async def aclose(self) -> None:
        await self._client.aclose()

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        body = await self._post_with_retries(list(texts))
        return check_vectors(self._vectors(body), len(texts), self._dimensions)

    async def _post_with_retries(self, texts: list[str]) -> Any:
        path = "/api/embed" if self._flavor == "ollama" else "/v1/embeddings"
        payload = {"model": self._model, "input": texts}
        try:
            return await post_json(
                self._client,
                path,
                payload,
                retries=self._retries,
                attempt_seconds=self._timeout,
                max_bytes=answer_bytes_max(len(texts), self._dimensions),
            )
        except ProviderRefused as refused:
            raise EmbeddingFailed(
                f"The embedding provider refused the request (HTTP {refused.status})."
            ) from None
        except ProviderAnswerInvalid as invalid:
            raise EmbeddingInvalid(
                _UNUSABLE[invalid.reason].format(dims=self._dimensions)
            ) from None
        except ProviderUnreachable:
            raise EmbeddingFailed(
                "The embedding provider is unreachable or keeps failing."
            ) from None

    def _vectors(self, body: Any) -> object:
        """The vectors of the answer in input order; `check_vectors` then checks each one. Any
        other shape (wrong JSON types, indexes that are not exactly 0..n-1) is the provider's
        fault, never a 500."""
        if not isinstance(body, dict):
            raise _bad_shape()
        if self._flavor == "ollama":
            return body.get("embeddings")
        data = body.get("data")
        if not isinstance(data, list) or not all(
            isinstance(item, dict)
            and isinstance(item.get("index"), int)
            and not isinstance(item.get("index"), bool)
            and "embedding" in item
            for item in data
        ):
            raise _bad_shape()
        by_index = {item["index"]: item["embedding"] for item in data}
        if sorted(by_index) != list(range(len(data))):
            raise _bad_shape()
        return [by_index[i] for i in range(len(data))]


def _bad_shape() -> EmbeddingInvalid:
    return EmbeddingInvalid(
        "The embedding provider's answer has an unexpected shape. Nothing was written."
    )
