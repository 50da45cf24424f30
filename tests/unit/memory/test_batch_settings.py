"""MEMGATE_BATCH_MAX_ITEMS is bounded so a batch's one audit row can name all it touched."""

from __future__ import annotations

import dataclasses

import pytest

from service.calls import MAX_TARGETS
from service.settings import BATCH_ITEMS_CEILING, MemorySettings


def test_the_largest_batch_fits_its_audit_row() -> None:
    """Each item writes one memory and supersedes at most one version: both are targets."""
    assert 2 * BATCH_ITEMS_CEILING <= MAX_TARGETS
    assert MemorySettings(batch_max_items=BATCH_ITEMS_CEILING).batch_max_items == 500


@pytest.mark.parametrize("items", [0, BATCH_ITEMS_CEILING + 1, 10_000])
def test_a_batch_limit_the_audit_row_cannot_hold_is_refused_at_start(items: int) -> None:
    with pytest.raises(ValueError, match="MEMGATE_BATCH_MAX_ITEMS must be between 1 and 500"):
        dataclasses.replace(MemorySettings(), batch_max_items=items)
