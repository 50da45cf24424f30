"""The token endpoint's admission (review item 1, red-team findings 4 and 5): failures counted
when they settle, per key; a bounded share of the in-flight bound per source and per client
id; refusals for concurrency are never called failures; bounded memory."""

from __future__ import annotations

import uuid

import pytest

from service.auth import throttle
from service.auth.problems import OAuthOverloaded, OAuthTooManyFailures
from service.auth.throttle import TokenGate, source_key
from service.settings import AuthSettings


def _gate(**limits: float) -> TokenGate:
    settings: dict[str, float] = {
        "max_in_flight": 100,
        "max_in_flight_per_source": 100,
        "max_in_flight_per_client": 100,
        "failure_burst": 3,
        "failures_per_minute": 1.0,
    }
    settings.update(limits)
    return TokenGate(**settings)  # type: ignore[arg-type]


def test_failures_spend_the_allowance_when_they_settle() -> None:
    gate = _gate()
    client = str(uuid.uuid4())
    for _ in range(3):
        gate.admit(client, "10.0.0.1").settle(failed=True)
    with pytest.raises(OAuthTooManyFailures) as refused:
        gate.admit(client, "10.0.0.2")  # the client id's allowance, from another source
    assert refused.value.retry_after >= 1
    assert refused.value.headers() == {"Retry-After": str(refused.value.retry_after)}
    with pytest.raises(OAuthTooManyFailures):
        gate.admit(str(uuid.uuid4()), "10.0.0.1")  # the source's allowance, another client id
    assert gate.in_flight == 0


def test_concurrent_successes_never_touch_the_failure_allowance() -> None:
    """Red-team finding 4: one token was taken from each bucket up front, so 15 concurrent
    requests with the right secret got five 429s, and another client of the source too."""
    gate = _gate(failure_burst=3)
    client = str(uuid.uuid4())
    admitted = [gate.admit(client, "10.0.0.1") for _ in range(15)]
    other = gate.admit(str(uuid.uuid4()), "10.0.0.1")
    for admission in [*admitted, other]:
        admission.settle(failed=False)
    # Nothing failed: the whole allowance is still there, for this client and the source.
    for _ in range(3):
        gate.admit(client, "10.0.0.1").settle(failed=True)
    with pytest.raises(OAuthTooManyFailures):
        gate.admit(client, "10.0.0.1")


def test_unsettled_attempts_are_bounded_per_key_and_refused_as_busy_not_as_failures() -> None:
    gate = _gate(max_in_flight_per_client=2, max_in_flight_per_source=3, failure_burst=1)
    client = str(uuid.uuid4())
    first = gate.admit(client, "10.0.0.1")
    gate.admit(client, "10.0.0.2")
    with pytest.raises(OAuthOverloaded) as busy:
        gate.admit(client, "10.0.0.3")  # the client id's share
    assert type(busy.value) is OAuthOverloaded
    assert busy.value.status == 503
    gate.admit(str(uuid.uuid4()), "10.0.0.1")
    gate.admit(str(uuid.uuid4()), "10.0.0.1")
    with pytest.raises(OAuthOverloaded) as busy:
        gate.admit(str(uuid.uuid4()), "10.0.0.1")  # the source's share
    assert type(busy.value) is OAuthOverloaded
    first.settle(failed=False)
    gate.admit(client, "10.0.0.3")  # a settled attempt gives its place back
    # Failures of overlapping attempts all count, however many were in flight at once.
    late = _gate(failure_burst=2)
    attempts = [late.admit(client, "10.0.0.9") for _ in range(4)]
    for attempt in attempts:
        attempt.settle(failed=True)
    with pytest.raises(OAuthTooManyFailures) as refused:
        late.admit(client, "10.0.0.8")
    assert refused.value.retry_after >= 3 * 60  # three failures past the allowance to pay off


def test_one_source_or_client_cannot_take_the_whole_in_flight_bound() -> None:
    """Red-team finding 5: a few sources filled the process-wide bound and others got 503."""
    gate = _gate(max_in_flight=16, max_in_flight_per_source=8, max_in_flight_per_client=4)
    for _ in range(8):
        gate.admit(str(uuid.uuid4()), "198.51.100.7")
    with pytest.raises(OAuthOverloaded):
        gate.admit(str(uuid.uuid4()), "198.51.100.7")
    client = str(uuid.uuid4())
    for n in range(4):
        gate.admit(client, f"203.0.113.{n}")
    with pytest.raises(OAuthOverloaded):
        gate.admit(client, "203.0.113.200")
    assert gate.in_flight == 12
    gate.admit(str(uuid.uuid4()), "192.0.2.1")  # room left for everyone else
    # The process-wide bound still holds.
    for n in range(3):
        gate.admit(str(uuid.uuid4()), f"192.0.2.{10 + n}")
    with pytest.raises(OAuthOverloaded):
        gate.admit(str(uuid.uuid4()), "192.0.2.99")


def test_ipv6_sources_are_keyed_by_their_64_bit_prefix() -> None:
    assert source_key("2001:db8:1:2::1") == source_key("2001:db8:1:2:ffff::9")
    assert source_key("2001:db8:1:2::1") != source_key("2001:db8:1:3::1")
    assert source_key("::ffff:192.0.2.1") == source_key("192.0.2.1")
    assert source_key("192.0.2.1") != source_key("192.0.2.2")
    assert source_key("testclient") == "source:testclient"
    gate = _gate(max_in_flight_per_source=2)
    gate.admit(str(uuid.uuid4()), "2001:db8::1")
    gate.admit(str(uuid.uuid4()), "2001:db8::2")
    with pytest.raises(OAuthOverloaded):
        gate.admit(str(uuid.uuid4()), "2001:db8::3")  # one /64, one share


def test_tracked_keys_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(throttle, "MAX_TRACKED_KEYS", 50)
    gate = _gate(max_in_flight=10, failure_burst=5)
    for i in range(500):
        gate.admit(str(uuid.uuid4()), f"10.1.{i // 256}.{i % 256}").settle(failed=True)
    assert len(gate._failures._buckets) <= 50
    assert not gate._pending


def test_limits_out_of_range_stop_the_service() -> None:
    for bad in (
        {"token_max_in_flight": 0},
        {"token_max_in_flight_per_source": 0},
        {"token_max_in_flight_per_client": 0},
        {"token_failure_burst": 0},
        {"token_failures_per_minute": 0.0},
        {"token_db_wait_seconds": 0.0},
    ):
        with pytest.raises(ValueError, match="MEMGATE_TOKEN_"):
            AuthSettings(**bad)
