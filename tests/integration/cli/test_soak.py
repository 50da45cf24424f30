"""The soak benchmark at a reduced, bounded size (issue 18): 20 seconds of the mixed load at a
fixed rate against a real `memgate serve`: every route answered, none with an error, memory
sampled. The full run is `python -m bench.soak` (30 minutes; docs/operations.md, "Crashes")."""

from __future__ import annotations

from bench.soak import MIX, soak

SECONDS = 20
RATE = 20.0


def test_a_short_soak_answers_every_request_of_every_route() -> None:
    # A fresh token every 5 s: the switch from one to the next happens under load too.
    report = soak(SECONDS / 60, RATE, workers=2, memories=100, sample_seconds=2, refresh_seconds=5)
    assert [route.route for route in report.routes] == [route for route, _ in MIX]
    assert sum(route.requests for route in report.routes) == int(SECONDS * RATE)
    for route in report.routes:
        assert route.requests > 0, route
        assert route.errors == 0, report.statuses
        assert 0 < route.p50 <= route.p95 <= route.p99, route
    assert len(report.samples) >= SECONDS // 2
    assert report.app_mb[0] > 0
    assert report.database_mb[0] > 0
