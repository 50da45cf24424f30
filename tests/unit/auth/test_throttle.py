"""The token endpoint's admission (review item 1): buckets per key, bounded memory, refunds."""

from __future__ import annotations

import uuid

import pytest

from service.auth import throttle
from service.auth.problems import OAuthOverloaded, OAuthTooManyFailures
from service.auth.throttle import TokenGate
from service.settings import AuthSettings


def test_failures_spend_the_allowance_and_successes_give_it_back() -> None:
    gate = TokenGate(max_in_flight=100, failure_burst=3, failures_per_minute=1.0)
    client = str(uuid.uuid4())
    for _ in range(3):
        gate.admit(client, "10.0.0.1").settle(authenticated=False)
    with pytest.raises(OAuthTooManyFailures) as refused:
        gate.admit(client, "10.0.0.2")  # the client id's allowance, from another source
    assert refused.value.retry_after >= 1
    assert refused.value.headers() == {"Retry-After": str(refused.value.retry_after)}
    other = str(uuid.uuid4())
    with pytest.raises(OAuthTooManyFailures):
        gate.admit(other, "10.0.0.1")  # the source's allowance, for another client id
    fresh = TokenGate(max_in_flight=100, failure_burst=1, failures_per_minute=1.0)
    for _ in range(5):
        fresh.admit(client, "10.0.0.3").settle(authenticated=True)
    assert fresh.in_flight == 0


def test_in_flight_requests_are_bounded_and_refusals_spend_nothing() -> None:
    gate = TokenGate(max_in_flight=2, failure_burst=2, failures_per_minute=1.0)
    first = gate.admit(str(uuid.uuid4()), "a")
    gate.admit(str(uuid.uuid4()), "b")
    with pytest.raises(OAuthOverloaded) as busy:
        gate.admit(str(uuid.uuid4()), "c")
    assert busy.value.status == 503
    first.settle(authenticated=True)
    gate.admit(str(uuid.uuid4()), "c")  # source c spent nothing when it was turned away


def test_tracked_keys_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(throttle, "MAX_TRACKED_KEYS", 50)
    gate = TokenGate(max_in_flight=10, failure_burst=5, failures_per_minute=1.0)
    for i in range(500):
        gate.admit(str(uuid.uuid4()), f"source-{i}").settle(authenticated=False)
    assert len(gate._failures._buckets) <= 50


def test_limits_out_of_range_stop_the_service() -> None:
    for bad in (
        {"token_max_in_flight": 0},
        {"token_failure_burst": 0},
        {"token_failures_per_minute": 0.0},
        {"token_db_wait_seconds": 0.0},
    ):
        with pytest.raises(ValueError, match="MEMGATE_TOKEN_"):
            AuthSettings(**bad)
