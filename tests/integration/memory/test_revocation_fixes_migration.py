"""Migration `20261202_revocation_fixes`: rows written before the revocation migration are
re-hashed with the current normalization (red team 15, finding 1), so a copy spelled with
invisible characters matches its clean twin on the revocation walk."""

from __future__ import annotations

import hashlib
import unicodedata
import uuid

import psycopg
import pytest

from service.db.migrate import upgrade
from service.memory.normalize import content_hash
from tests.fixtures.postgres import with_database

BEFORE = "20261202_idempotency_keys"
AFTER = "20261202_revocation_fixes"
VECTOR = "[" + ",".join(["0.1"] * 256) + "]"
CLEAN = "Refunds above 200 EUR need a second signature"
SNEAKY = "Refunds\u200b above 200 EUR need a second\u034f signature\ufe0f"


def _legacy(value: str) -> bytes:
    """The content hash rows were written with before the revocation migration."""
    return hashlib.sha256(
        " ".join(unicodedata.normalize("NFKC", value).casefold().split()).encode()
    ).digest()


@pytest.mark.bypasses_visible("migrations and their data, as the owner: what is really stored")
def test_rows_written_before_revocation_are_rehashed(pg_server: str) -> None:
    name = "revocation_fixes_rehash"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    url = with_database(pg_server, name)
    upgrade(url, BEFORE)
    tenant, space = uuid.uuid4(), uuid.uuid4()
    ids: dict[str, uuid.UUID] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO tenants (tenant_id, name) VALUES (%s, 't')", (tenant,))
        conn.execute(
            "INSERT INTO spaces (tenant_id, id, kind, name) VALUES (%s, %s, 'team', 's')",
            (tenant, space),
        )
        for key, value in (("a", CLEAN), ("b", SNEAKY)):
            ids[key] = uuid.uuid4()
            conn.execute(
                "INSERT INTO memories (tenant_id, id, space_id, owner_id, writer_id, client_id,"
                " subject, kind, key, value, content_hash, embedding, embedding_model,"
                " valid_from, recorded_at, read_requires) VALUES (%s, %s, %s, %s, %s, 'c',"
                " 'policy:refunds', 'fact', %s, %s, %s, %s, 'm', now(), now(), '{}')",
                (tenant, ids[key], space, tenant, tenant, key, value, _legacy(value), VECTOR),
            )
    assert _legacy(CLEAN) != _legacy(SNEAKY)  # the old hash told them apart
    upgrade(url, "20261202_review_state")
    # A revocation made on the clean claim while the old hashes were still stored (a deploy
    # running the revocation migration before this one): the sneaky copy escaped it.
    with psycopg.connect(url) as conn:
        conn.execute("SELECT set_config('memgate.tenant_id', %s, true)", (str(tenant),))
        revocation = uuid.uuid4()
        conn.execute(
            "INSERT INTO revocations (tenant_id, id, memory_id, space_id, content_hash, reason,"
            " revoked_by) VALUES (%s, %s, %s, %s, %s, 'withdrawn', %s)",
            (tenant, revocation, ids["a"], space, content_hash(CLEAN), tenant),
        )
        conn.execute("SELECT count(*) FROM memgate_revocation_hide(%s)", (revocation,))
        conn.commit()
    with psycopg.connect(url) as conn:
        before: dict[uuid.UUID, bool] = dict(
            conn.execute("SELECT id, revoked_at IS NOT NULL FROM memories").fetchall()
        )
    assert before == {ids["a"]: True, ids["b"]: False}  # the escape the fix closes
    upgrade(url, AFTER)
    with psycopg.connect(url) as conn:
        stored: dict[uuid.UUID, bytes] = dict(
            conn.execute("SELECT id, content_hash FROM memories").fetchall()
        )
        hidden: dict[uuid.UUID, bool] = dict(
            conn.execute("SELECT id, revoked_at IS NOT NULL FROM memories").fetchall()
        )
        causes = conn.execute(
            "SELECT memory_id FROM memory_hidings WHERE revocation_id = %s ORDER BY memory_id",
            (revocation,),
        ).fetchall()
    assert bytes(stored[ids["b"]]) == content_hash(SNEAKY) == content_hash(CLEAN)
    assert bytes(stored[ids["a"]]) == bytes(stored[ids["b"]])
    assert hidden == {ids["a"]: True, ids["b"]: True}
    assert sorted(row[0] for row in causes) == sorted(ids.values())
