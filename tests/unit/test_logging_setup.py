from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from service.observability.logging import configure_logging


@pytest.fixture
def root_at_debug() -> Iterator[None]:
    root, authlib = logging.getLogger(), logging.getLogger("authlib")
    saved = root.level, authlib.level
    root.setLevel(logging.DEBUG)  # an operator turning on debug logs for the whole process
    yield
    root.setLevel(saved[0])
    authlib.setLevel(saved[1])


@pytest.mark.usefixtures("root_at_debug")
def test_authlib_cannot_log_issued_tokens_even_in_debug() -> None:
    configure_logging(json_logs=True, level=logging.DEBUG)
    assert not logging.getLogger("authlib").isEnabledFor(logging.DEBUG)
    assert not logging.getLogger("authlib.oauth2.rfc6749").isEnabledFor(logging.INFO)
