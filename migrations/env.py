"""Alembic environment: runs migrations over psycopg 3 (sync) with a lock timeout."""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import create_engine, pool

from service.db import models  # noqa: F401  (registers the tables on Base.metadata)
from service.db.base import Base
from service.db.session import async_url

config = context.config
target_metadata = Base.metadata


def include_object(
    obj: object, name: str | None, type_: str, reflected: bool, compare_to: object
) -> bool:
    """Monthly audit partitions are made at run time by `audit_ensure_partition()`, not by
    models; models marked `is_view` are views the migrations create by hand."""
    if type_ == "table" and getattr(obj, "info", {}).get("is_view"):
        return False
    return not (
        type_ == "table"
        and reflected
        and compare_to is None
        and str(name).startswith("audit_events_")
    )


def run_migrations_online() -> None:
    # `memgate migrate` sets the URL; a bare `alembic` command reads DATABASE_URL.
    url = config.get_main_option("sqlalchemy.url") or async_url(os.environ["DATABASE_URL"])
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            include_object=include_object,
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline migrations are not supported; run `memgate migrate`")
run_migrations_online()
