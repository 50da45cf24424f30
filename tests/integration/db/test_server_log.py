"""The embedded cluster's server log keeps caller values out: a constraint violation is logged
(an operator sees it happened) without the DETAIL that repeats the key's values, and without the
statement that carried them."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from service.db.embedded import EmbeddedPostgres


@pytest.fixture
def cluster() -> Iterator[tuple[str, Path]]:
    data_dir = Path(tempfile.mkdtemp(prefix="memgate-log-"))
    embedded = EmbeddedPostgres(data_dir, delete_on_stop=True)
    try:
        yield embedded.start(), data_dir / "pgdata" / "log"
    finally:
        embedded.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


def test_a_constraint_violation_logs_no_caller_value(cluster: tuple[str, Path]) -> None:
    url, log = cluster
    bound = f"alice-{uuid.uuid4().hex}@example.com"
    literal = f"bob-{uuid.uuid4().hex}@example.com"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE people (subject text UNIQUE)")
        conn.execute("INSERT INTO people VALUES (%s)", (bound,))
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute("INSERT INTO people VALUES (%s)", (bound,))
        conn.execute(f"INSERT INTO people VALUES ('{literal}')")
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute(f"INSERT INTO people VALUES ('{literal}')")
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute("UPDATE people SET subject = %s WHERE subject = %s", (bound, literal))
    text = log.read_text()
    assert text.count("duplicate key value violates unique constraint") == 3
    assert bound not in text
    assert literal not in text
    assert "DETAIL" not in text
    assert "STATEMENT" not in text
