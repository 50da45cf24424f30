"""What an erasure can show about the database files: VACUUM the touched tables after the
deletion commits, and where the files are on this machine (the embedded default), scan them
for the erased bytes before and after.

A plain VACUUM marks dead tuples reusable but does not overwrite them (the bytes stay in free
space until reused); `VACUUM FULL` rewrites each table and its indexes into new files and
unlinks the old ones, which is what makes "not in the files" true. It takes an ACCESS
EXCLUSIVE lock on each table for the rewrite (reads wait), so a plan may ask for the plain
VACUUM instead and the proof then says the bytes may remain in free space. Neither reaches WAL,
replicas or backups (docs/erasure.md)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from sqlalchemy.engine import make_url

TOUCHED_TABLES = (
    "memories",
    "memory_hidings",
    "revocations",
    "memory_recalls",
    "review_rejections",
    "idempotency_keys",
    "audit_actors",
    "erasure_plans",
)
"""The tables an erasure deletes from or rewrites (migration 20261203_erasure grants the app
role MAINTAIN on them)."""
TENANT_TABLES = (
    *TOUCHED_TABLES,
    "erasure_tombstones",
    "job_runs",
    "audit_pseudonym_keys",
    "principals",
    "clients",
    "spaces",
    "space_grants",
    "casbin_rule",
    "teams",
    "delegations",
    "role_grants",
    "principal_roles",
    "tenant_issuers",
    "tenant_limits",
    "quota_buckets",
    "quota_slots",
    "tenant_usage",
    "tenants",
    "audit_events",
    "audit_heads",
    "audit_checkpoints",
)
"""What a tenant's erasure deletes from (memgate_erase_tenant), the audit chain included for
when the operator drops it."""
MAX_NEEDLES = 200
"""Needles a scan looks for (the erased values first, then the names); the proof says when
there were more."""
MAX_SCAN_BYTES = 8 << 30
"""Bytes a scan reads at most (8 GiB); past it the proof says the scan is incomplete."""
_CHUNK = 8 << 20

# Every file of the touched tables: the heap, its TOAST table and TOAST index, every index.
_RELATIONS = """
SELECT c.relname, pg_relation_filepath(c.oid)
  FROM pg_class c
 WHERE c.oid IN (
        SELECT t.oid FROM pg_class t WHERE t.relname = ANY (%(tables)s) AND t.relkind = 'r'
        UNION SELECT t.reltoastrelid FROM pg_class t
               WHERE t.relname = ANY (%(tables)s) AND t.reltoastrelid <> 0
        UNION SELECT i.indexrelid FROM pg_index i JOIN pg_class t ON t.oid = i.indrelid
               WHERE t.relname = ANY (%(tables)s)
        UNION SELECT i.indexrelid FROM pg_index i JOIN pg_class t ON t.reltoastrelid = i.indrelid
               WHERE t.relname = ANY (%(tables)s))
   AND pg_relation_filepath(c.oid) IS NOT NULL
 ORDER BY 1
"""


@dataclass(frozen=True)
class Maintenance:
    """How this process reaches the database's maintenance: `owner_url` (the embedded
    default, or `MEMGATE_MIGRATION_DATABASE_URL`) to CHECKPOINT, VACUUM and find the files;
    else the app's own login (VACUUM through its MAINTAIN grant, no file scan)."""

    owner_url: str | None
    app_url: str

    def _connect(self) -> psycopg.Connection[Any]:
        url = make_url(self.owner_url or self.app_url).set(drivername="postgresql")
        # visible: ok maintenance: CHECKPOINT, VACUUM, reads pg_class and server settings only
        return psycopg.connect(url.render_as_string(hide_password=False), autocommit=True)

    def local_data_directory(self) -> tuple[Path | None, str]:
        """The cluster's data directory when its files are on this machine, else why not."""
        if self.owner_url is None:
            return None, "no owner connection: the files' location is not known to memgate"
        try:
            with self._connect() as conn:
                row = conn.execute("SELECT current_setting('data_directory')").fetchone()
        except psycopg.Error as exc:
            return None, f"the server does not say where its files are ({exc.sqlstate})"
        directory = Path(str(row[0])) if row else None
        if directory is None or not (directory / "PG_VERSION").is_file():
            return None, "the database files are not on this machine (managed or remote server)"
        return directory, "local"

    def checkpoint(self) -> bool:
        """Write every dirty buffer to the files (what a scan reads); False when not allowed."""
        try:
            with self._connect() as conn:
                conn.execute("CHECKPOINT")
        except psycopg.Error:
            return False
        return True

    def vacuum(self, tables: Sequence[str], *, rewrite: bool) -> dict[str, str]:
        """VACUUM (FULL when `rewrite`) then ANALYZE each touched table; per table 'ok' or the
        error's SQLSTATE (a server older than 17 without the owner's URL refuses: 42501)."""
        done: dict[str, str] = {}
        verb = sql.SQL("VACUUM (FULL, ANALYZE) {}" if rewrite else "VACUUM (ANALYZE) {}")
        with self._connect() as conn:
            # A rewrite queued behind a long transaction would hold every reader of the table
            # behind it: give up on that table instead (the proof says which).
            conn.execute("SET lock_timeout = '5s'")
            for table in tables:
                try:
                    conn.execute(verb.format(sql.Identifier(table)))
                    done[table] = "ok"
                except psycopg.Error as exc:
                    done[table] = f"refused ({exc.sqlstate})"
        return done

    def relation_files(self, directory: Path, tables: Sequence[str]) -> list[tuple[str, Path]]:
        with self._connect() as conn:
            rows = conn.execute(_RELATIONS, {"tables": list(tables)}).fetchall()
        return [(str(name), directory / str(path)) for name, path in rows]


def scan(
    files: Sequence[tuple[str, Path]], needles: Sequence[bytes], budget: int = MAX_SCAN_BYTES
) -> dict[str, Any]:
    """How many of the files hold each needle (by its index), and which relations held any:
    names of tables and indexes only, never the bytes. One pass per file for all needles (one
    compiled alternation); `complete` is False when `budget` bytes ran out first."""
    found = [0] * len(needles)
    holding: set[str] = set()
    wanted = [needle for needle in needles if needle]
    pattern = re.compile(b"|".join(re.escape(one) for one in wanted)) if wanted else None
    longest = max((len(needle) for needle in needles), default=0)
    scanned, read = 0, 0
    for relation, base in files:
        for segment in _segments(base):
            if read >= budget:
                return _scanned(scanned, found, holding, complete=False)
            scanned += 1
            hits, size = _scan_file(segment, pattern, needles, longest)
            read += size
            for index in hits:
                found[index] += 1
            if hits:
                holding.add(relation)
    return _scanned(scanned, found, holding, complete=True)


def _scanned(files: int, found: list[int], holding: set[str], *, complete: bool) -> dict[str, Any]:
    return {"files": files, "found": found, "relations": sorted(holding), "complete": complete}


def _segments(base: Path) -> list[Path]:
    """A relation's main fork and its 1 GB segments (`.1`, `.2` ...)."""
    segments = [base] if base.exists() else []
    number = 1
    while (segment := base.with_name(f"{base.name}.{number}")).exists():
        segments.append(segment)
        number += 1
    return segments


def _scan_file(
    path: Path, pattern: re.Pattern[bytes] | None, needles: Sequence[bytes], longest: int
) -> tuple[set[int], int]:
    """The indexes of the needles the file holds, and the bytes read. One pass of the compiled
    alternation per chunk; only a chunk where it matches is searched needle by needle (a
    needle inside another's match, a name inside an erased value, is then found too). A match
    may span two chunks: each window keeps the last `longest` bytes of the one before."""
    hits: set[int] = set()
    overlap, size = b"", 0
    if pattern is None:
        return hits, size
    try:
        with path.open("rb") as handle:
            while chunk := handle.read(_CHUNK):
                size += len(chunk)
                window = overlap + chunk
                if pattern.search(window) is not None:
                    hits.update(
                        i for i, needle in enumerate(needles) if needle and needle in window
                    )
                overlap = window[-longest:] if longest else b""
    except FileNotFoundError:  # rewritten away while scanning: nothing of it is left
        return hits, size
    return hits, size
