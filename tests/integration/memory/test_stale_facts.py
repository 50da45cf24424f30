"""The stale-fact scenario (bench/stale_facts.py) as a test, through the real API: with the
write gate on, every probe's top hit is the current value and every look-alike neighbour
survives; with it off, the four facts updated under a new key keep their stale value live."""

from __future__ import annotations

from bench.stale_facts import FACTS, NEIGHBOURS, play
from tests.fixtures.api import Api

NEW_KEY_UPDATES = sum(fact.new_key is not None for fact in FACTS)


async def test_with_the_gate_every_probe_finds_the_current_value(api: Api) -> None:
    writer = await api.new_agent("writer", scopes=("read:memory", "write:memory"))
    outcome = await play(api.http, api.admin.headers, writer.headers, gate=True)
    assert (len(FACTS), NEW_KEY_UPDATES, len(NEIGHBOURS)) == (10, 4, 5)
    assert outcome.misses == ()
    assert outcome.top_current == len(FACTS)
    assert (outcome.top_stale, outcome.stale_in_hits) == (0, 0)
    assert outcome.neighbours_alive == len(NEIGHBOURS)
    # Every new-key update was stopped and resolved by reusing the offered key.
    assert outcome.conflicts_resolved == NEW_KEY_UPDATES


async def test_without_the_gate_the_new_key_updates_leave_stale_values_live(api: Api) -> None:
    writer = await api.new_agent("writer", scopes=("read:memory", "write:memory"))
    outcome = await play(api.http, api.admin.headers, writer.headers, gate=False)
    assert outcome.conflicts_resolved == 0
    # Each stale value is still live and still found beside its update.
    assert outcome.stale_in_hits == NEW_KEY_UPDATES
    assert outcome.top_stale <= NEW_KEY_UPDATES
    assert outcome.neighbours_alive == len(NEIGHBOURS)
