"""Search limits out of range stop the service at start, not every large search at run time."""

from __future__ import annotations

from typing import Any

import pytest

from service.settings import MemorySettings


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"exact_search_max_rows": -5}, "MEMGATE_SEARCH_EXACT_MAX_ROWS"),
        ({"ann_ef_search": 0}, "MEMGATE_SEARCH_ANN_EF"),
        ({"ann_ef_search": 2000}, "MEMGATE_SEARCH_ANN_EF"),
        ({"ann_max_scan_tuples": 0}, "MEMGATE_SEARCH_ANN_MAX_SCAN"),
        ({"score_floor": 1.5}, "MEMGATE_SEARCH_SCORE_FLOOR"),
        ({"score_floor": -0.1}, "MEMGATE_SEARCH_SCORE_FLOOR"),
        ({"lexical_floor": 0}, "MEMGATE_SEARCH_LEXICAL_FLOOR"),
        ({"fusion_depth": 0}, "MEMGATE_SEARCH_FUSION_DEPTH"),
        ({"text_search_config": "klingon"}, "MEMGATE_TEXT_SEARCH_CONFIG"),
    ],
)
def test_out_of_range_search_limits_are_refused(fields: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        MemorySettings(**fields)


def test_the_defaults_and_the_edges_are_accepted() -> None:
    MemorySettings()
    MemorySettings(exact_search_max_rows=0, ann_ef_search=1, ann_max_scan_tuples=1)
    MemorySettings(ann_ef_search=1000)


def test_the_environment_is_checked_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMGATE_SEARCH_ANN_EF", "5000")
    with pytest.raises(ValueError, match="MEMGATE_SEARCH_ANN_EF"):
        MemorySettings.from_env()
