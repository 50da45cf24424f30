"""The statement check behind promise 2 (tests/fixtures/entrance.py), on statement texts."""

from __future__ import annotations

import pytest

from service.policy.visible import VISIBLE_MARK
from tests.fixtures.entrance import unmarked_sources

M = VISIBLE_MARK
CASES = {
    # (statement, unmarked memory sources)
    "bare select": ("SELECT count(*) FROM memories", 1),
    "marked select": (f"SELECT {M} memories.id FROM memories WHERE memories.id = 1", 0),
    "quoted and schema": ('SELECT "memories"."id" FROM "public"."memories"', 1),
    "comma join": ("SELECT spaces.id FROM spaces, memories", 1),
    "alias joined onto a marked select": (
        f"SELECT {M} memories.id FROM memories JOIN memories AS memories_1 ON true",
        1,
    ),
    "marked recursive walk": (
        f"WITH RECURSIVE c AS (SELECT {M} memories.id FROM memories UNION ALL "
        f"SELECT {M} hop.id FROM memories AS hop JOIN c ON true) SELECT c.id FROM c",
        0,
    ),
    "marked update": (f"UPDATE {M} memories SET value = 'x' RETURNING memories.id", 0),
    "bare delete": ("DELETE FROM memories WHERE memories.id = 1", 1),
    "insert": ("INSERT INTO memories (id) VALUES (1) RETURNING memories.id", 0),
    "insert from a read": ("INSERT INTO memories (id) SELECT id FROM memories", 1),
    "upsert": ("INSERT INTO memories (id) VALUES (1) ON CONFLICT (id) DO UPDATE SET id = 2", 1),
    "copy in": ("COPY memories (id, value) FROM STDIN", 0),
    "copy out": ("COPY (SELECT value FROM memories) TO STDOUT", 1),
    "schema": ("CREATE INDEX ix ON memories USING hnsw (embedding)", 0),
    "a view reads": ("CREATE VIEW v AS SELECT value FROM memories", 1),
    "migration script": ("SET LOCAL lock_timeout = '5s'; ALTER TABLE memories ADD x int", 0),
    "script with a read": ("SELECT 1; SELECT value FROM memories", 1),
    "maintenance": ("VACUUM (ANALYZE) memories", 0),
    "an alias name is not the table": ("SELECT memories_1.id FROM spaces AS memories_1", 0),
    "other tables": ("SELECT space_grants.space_id FROM space_grants", 0),
    "the word in a comment": ("SELECT 1 /* FROM memories */", 0),
    "the word in a literal": ("SELECT audit_append('GET', '/v1/memories', 'it''s memories')", 0),
    "a grant lists the table": ("GRANT SELECT ON tenants, memories, spaces TO memgate_app", 0),
}


@pytest.mark.parametrize("case", list(CASES))
def test_unmarked_sources(case: str) -> None:
    statement, expected = CASES[case]
    assert unmarked_sources(statement) == expected
