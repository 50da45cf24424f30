from __future__ import annotations

import logging

from service.observability.logging import configure_logging


def test_authlib_cannot_log_issued_tokens_even_in_debug() -> None:
    configure_logging(json_logs=True, level=logging.DEBUG)
    assert not logging.getLogger("authlib").isEnabledFor(logging.DEBUG)
    assert not logging.getLogger("authlib.oauth2.rfc6749").isEnabledFor(logging.INFO)
