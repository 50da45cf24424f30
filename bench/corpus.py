"""Sentences like the ones agents store: a few templates filled from small vocabularies, so
their embeddings cluster by topic the way real memories do (random vectors have no neighbours
worth the name, which is the worst case for a graph index and not what memgate serves)."""

from __future__ import annotations

import random

TEAMS = ["billing", "search", "auth", "payments", "infra", "mobile", "data", "support"]
PEOPLE = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy"]
DAYS = ["monday", "tuesday", "wednesday", "thursday", "friday"]
THINGS = [
    "dark mode",
    "short standups",
    "written specs",
    "pair programming",
    "green tea",
    "quiet mornings",
    "vim",
    "detailed changelogs",
    "postgres",
    "small pull requests",
]
CAUSES = [
    "an expired certificate",
    "a full disk",
    "a bad config push",
    "a slow database query",
    "a dns outage",
    "a memory leak",
]
TEMPLATES = [
    "the {team} team deploys on {day} after the {hour} o'clock review",
    "{person} owns the {team} service and prefers {thing}",
    "the {team} incident on {day} was caused by {cause}",
    "{person} asked the {team} team to plan around {cause}",
    "{person} likes {thing} and works with {other} on {team}",
    "on {day} the {team} dashboard showed {cause} at {hour}",
]


def sentences(count: int, seed: int) -> list[str]:
    """`count` sentences; the ticket number keeps near-duplicates apart (no exact ties)."""
    rng = random.Random(seed)
    return [
        (rng.choice(TEMPLATES) + " (ticket {ticket})").format(
            ticket=rng.randint(1000, 99999),
            team=rng.choice(TEAMS),
            day=rng.choice(DAYS),
            hour=rng.randint(1, 12),
            person=rng.choice(PEOPLE),
            other=rng.choice(PEOPLE),
            thing=rng.choice(THINGS),
            cause=rng.choice(CAUSES),
        )
        for _ in range(count)
    ]
