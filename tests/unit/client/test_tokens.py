"""When the client replaces a token, and what it sends to get one."""

from __future__ import annotations

import pytest
from memgate_client.credentials import (
    ACCESS_TOKEN_TYPE,
    TOKEN_EXCHANGE,
    CachedToken,
    ClientCredentials,
    TokenExchange,
    refresh_margin,
)


@pytest.mark.parametrize(
    ("expires_in", "margin"), [(600, 60.0), (3600, 60.0), (60, 13.0), (3, 1.6), (0, 1.0)]
)
def test_a_token_is_replaced_a_second_and_a_fifth_of_its_life_early(
    expires_in: int, margin: float
) -> None:
    assert refresh_margin(expires_in) == pytest.approx(margin)
    cached = CachedToken.issued("t", expires_in, asked_at=100.0)
    assert cached.refresh_at == pytest.approx(100.0 + expires_in - margin)


def test_the_forms_name_the_grant_and_never_show_the_secret() -> None:
    user = ClientCredentials("user", "s3cret", scope=["read:memory", "write:memory"])
    assert user.form() == {"grant_type": "client_credentials", "scope": "read:memory write:memory"}
    assert ClientCredentials("user", "s3cret").form() == {"grant_type": "client_credentials"}
    agent = TokenExchange("agent", "an0ther", subject=user)
    assert agent.form("user-token") == {
        "grant_type": TOKEN_EXCHANGE,
        "subject_token": "user-token",
        "subject_token_type": ACCESS_TOKEN_TYPE,
        "requested_token_type": ACCESS_TOKEN_TYPE,
    }
    assert "s3cret" not in repr(user)
    assert "s3cret" not in repr(agent)
    assert "an0ther" not in repr(agent)
