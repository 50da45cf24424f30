"""The retract_only_stubs migration on a database with data: a stub a deleter left open is
closed (it held its key's live slot), and a memory's own space leaves its `read_requires`
unless that would put two live versions in one key's slot (a chain the old rule had forked)."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from service.db.migrate import downgrade, upgrade
from tests.fixtures.postgres import with_database

BEFORE = "20261201_space_gates"
AFTER = "20261201_retract_only_stubs"
VECTOR = "[" + ",".join(["0.1"] * 256) + "]"


def _database_before(pg_server: str, name: str) -> str:
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    url = with_database(pg_server, name)
    upgrade(url, BEFORE)
    return url


def _memory(
    conn: psycopg.Connection[tuple[object, ...]],
    tenant: uuid.UUID,
    space: uuid.UUID,
    key: str,
    read_requires: list[uuid.UUID],
    *,
    stub: bool = False,
) -> uuid.UUID:
    memory_id = uuid.uuid4()
    conn.execute(
        "INSERT INTO memories (tenant_id, id, space_id, owner_id, writer_id, client_id, subject, "
        "kind, key, value, content_hash, embedding, embedding_model, valid_from, recorded_at, "
        "read_requires, retracted_at) VALUES (%s, %s, %s, %s, %s, 'c', 'service:billing', "
        "'fact', %s, %s, %s, %s, 'm', now(), now(), %s, %s)",
        (
            tenant,
            memory_id,
            space,
            tenant,
            tenant,
            key,
            "" if stub else "a value",
            b"" if stub else b"h",
            None if stub else VECTOR,
            read_requires,
            "2026-12-01T00:00:00Z" if stub else None,
        ),
    )
    return memory_id


@pytest.mark.bypasses_visible("migrations and their data, as the owner: what is really stored")
def test_open_stubs_are_closed_and_own_spaces_leave_the_audience(pg_server: str) -> None:
    url = _database_before(pg_server, "retract_only_stubs_migration")
    tenant, space, other = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO tenants (tenant_id, name) VALUES (%s, 't')", (tenant,))
        for space_id in (space, other):
            conn.execute(
                "INSERT INTO spaces (tenant_id, id, kind, name) VALUES (%s, %s, 'team', 's')",
                (tenant, space_id),
            )
        open_stub = _memory(conn, tenant, space, "jammed", [], stub=True)
        own = _memory(conn, tenant, space, "own", sorted([space, other]))
        forked_old = _memory(conn, tenant, space, "forked", [space])
        forked_new = _memory(conn, tenant, space, "forked", [])
    upgrade(url, AFTER)
    with psycopg.connect(url) as conn:
        rows = {
            row[0]: row[1:]
            for row in conn.execute(
                "SELECT id, superseded_at = retracted_at, read_requires FROM memories"
            )
        }
    assert rows[open_stub] == (True, [])
    assert rows[own] == (None, [other])
    # Both live in one key: normalizing the old one would collide with the new one.
    assert rows[forked_old] == (None, [space])
    assert rows[forked_new] == (None, [])
    # And back: the trigger and its functions go, the data stays as it is (same visibility).
    downgrade(url, BEFORE)
    with psycopg.connect(url) as conn:
        left = conn.execute(
            "SELECT count(*) FROM pg_trigger WHERE tgname = 'memories_retract_only'"
        ).fetchone()
        assert left == (0,)
    upgrade(url, AFTER)
