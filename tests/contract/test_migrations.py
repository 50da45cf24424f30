"""Migrations: upgrade → downgrade → upgrade on an empty database, then the models match."""

from __future__ import annotations

import psycopg
import pytest
from alembic import command
from sqlalchemy import create_engine, inspect

from service.db.migrate import alembic_config, downgrade, upgrade
from service.db.session import async_url
from tests.fixtures.postgres import with_database


# The quotas migration counts the live memories once, as the owner; a tenant's deletion
# (20261201_tenants_lifecycle) counts and removes its memory rows in a SECURITY DEFINER
# function, by design outside Visible: the function's body is read here.
@pytest.mark.bypasses_visible(
    "migrations define the memory table, the tenant deletion and the quotas' first count"
)
def test_upgrade_downgrade_upgrade_then_models_match(pg_server: str) -> None:
    name = "migrations_roundtrip"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    url = with_database(pg_server, name)
    upgrade(url)
    downgrade(url, "base")
    engine = create_engine(async_url(url))
    with engine.connect() as connection:
        assert set(inspect(connection).get_table_names()) == {"alembic_version"}
    upgrade(url)
    with engine.connect() as connection:
        tables = set(inspect(connection).get_table_names())
    engine.dispose()
    assert {"tenants", "principals", "clients", "signing_keys", "spaces", "memories"} <= tables
    command.check(alembic_config(url))  # raises if the models and the schema differ
