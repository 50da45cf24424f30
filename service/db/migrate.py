"""Alembic, driven from code: `memgate migrate`, `memgate serve` and the test fixtures all run
the same migrations in `migrations/`."""

from __future__ import annotations

import os
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.session import async_url

# A checkout (or editable install) finds migrations/ beside service/; an installed image points
# MEMGATE_MIGRATIONS_DIR at its copy.
MIGRATIONS_DIR = Path(
    os.environ.get("MEMGATE_MIGRATIONS_DIR") or Path(__file__).resolve().parents[2] / "migrations"
)


PYPROJECT = MIGRATIONS_DIR.parent / "pyproject.toml"


def alembic_config(database_url: str) -> Config:
    # In a checkout, [tool.alembic] in pyproject.toml supplies the dated file-name template.
    config = Config(toml_file=PYPROJECT) if PYPROJECT.exists() else Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", async_url(database_url).replace("%", "%%"))
    return config


def upgrade(database_url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(database_url), revision)


def downgrade(database_url: str, revision: str) -> None:
    command.downgrade(alembic_config(database_url), revision)


def new_revision(database_url: str, message: str) -> None:
    """Autogenerate a revision from the models (`memgate revision -m ...`)."""
    command.revision(alembic_config(database_url), message=message, autogenerate=True)


def head_revision() -> str | None:
    script = ScriptDirectory(str(MIGRATIONS_DIR))
    return script.get_current_head()


async def at_head(session: AsyncSession) -> bool:
    current = await session.scalar(text("SELECT version_num FROM alembic_version"))
    return current is not None and current == head_revision()
