"""The job tests drive the runner themselves: the app's in-process worker is off, so what a
test sees is what the runners it starts did."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from service.settings import JobSettings, Settings
from tests.conftest import make_settings


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    return replace(
        make_settings(database_url, tmp_path), jobs=JobSettings(poll_seconds=0, batch_size=3)
    )
