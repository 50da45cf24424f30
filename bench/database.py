"""Where a benchmark's database comes from: `DATABASE_URL`, or a scratch embedded cluster that
is deleted afterwards. Either way it is migrated to head."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from service.db.embedded import EmbeddedPostgres
from service.db.migrate import upgrade
from service.db.session import with_database


@contextmanager
def bench_database() -> Iterator[str]:
    if os.environ.get("DATABASE_URL"):
        url = os.environ["DATABASE_URL"]
        upgrade(url)
        yield url
        return
    embedded = EmbeddedPostgres(
        Path(tempfile.mkdtemp(prefix="memgate-bench-")), delete_on_stop=True
    )
    admin_url = embedded.start()
    try:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute("CREATE DATABASE bench")
        url = with_database(admin_url, "bench")
        upgrade(url)
        yield url
    finally:
        embedded.stop()
