"""Promise 3 under revocation: many hidden copies of the query's nearest text take no candidate
slot (the live-row indexes, HNSW included, leave hidden rows out: `revoked_at IS NULL` is part
of their predicate), so the k visible matches still come back, on the approximate path too."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from service.settings import MemorySettings, Settings
from tests.conftest import make_settings
from tests.fixtures.api import Agent, Api
from tests.integration.memory.revocation_support import post, revoke
from tests.integration.memory.support import scalar
from tests.integration.memory.test_search_strategy import _path_taken


@pytest.fixture(
    params=[MemorySettings(), MemorySettings(exact_search_max_rows=0)], ids=["exact", "walk"]
)
def settings(database_url: str, tmp_path: Path, request: pytest.FixtureRequest) -> Settings:
    return replace(make_settings(database_url, tmp_path), memory=request.param)


async def _write(api: Api, agent: Agent, key: str, value: str) -> Any:
    body = {"subject": "policy:refunds", "kind": "fact", "key": key, "value": value}
    response = await post(api, agent, "/v1/memories", body | {"new_key": True})
    assert response.status_code == 201, response.text
    return response.json()


async def test_hidden_near_duplicates_never_starve_search(
    api: Api, settings: Settings, span_exporter: InMemorySpanExporter
) -> None:
    """Promise 3: many hidden copies of the query's nearest text take no candidate slot; the
    k visible matches still come back, on the exact and the approximate (HNSW) path."""
    alice = await api.new_agent("alice")
    memory = (await _write(api, alice, "dup.0", "refund window is thirty days"))["memory"]
    await revoke(api, alice, memory["id"])
    copies = [
        {
            "subject": "policy:refunds",
            "kind": "fact",
            "key": f"dup.{i}",
            "value": "Refund window is thirty days" + " " * (i % 3),
            "new_key": True,
        }
        for i in range(1, 60)
    ]
    batch = await post(api, alice, "/v1/memories:batch", {"items": copies})
    assert batch.status_code == 201, batch.text
    assert {i["memory"]["status"] for i in batch.json()["items"]} == {"hidden"}
    visible = [
        (await _write(api, alice, f"far.{i}", f"refund desk note number {i}"))["memory"]["id"]
        for i in range(5)
    ]
    for mode in ("vector", "hybrid"):
        span_exporter.clear()  # spans of earlier tests' searches
        found = await api.search(alice, "refund window is thirty days", k=5, min_score=0, mode=mode)
        assert found.status_code == 200, found.text
        walk = settings.memory.exact_search_max_rows == 0
        assert _path_taken(span_exporter) == ("approximate" if walk else "exact")
        assert sorted(h["memory"]["id"] for h in found.json()["hits"]) == sorted(visible)
    hidden = await scalar(api.runtime, "SELECT count(*) FROM memories WHERE revoked_at IS NOT NULL")
    assert hidden == 60
