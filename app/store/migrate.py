"""Run Alembic from Python: `telegram-intake migrate`, SQLite auto-migration and the tests.

Equivalent to `alembic upgrade head` with INTAKE_DATABASE_URL set; concurrent callers
serialise on a migration lock (see alembic/env.py).
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext

from app.store import validate
from app.store.engine import create_sync_engine
from app.store.schema import DEFAULT_TABLE, version_table_name

PROJECT_ROOT = Path(__file__).resolve().parents[2]
ALEMBIC_INI = PROJECT_ROOT / "alembic.ini"


def alembic_config(url: str, *, table: str = DEFAULT_TABLE) -> Config:
    """An Alembic config bound to this database and table, leaving logging alone."""
    config = Config(str(ALEMBIC_INI))
    config.set_main_option("script_location", str(PROJECT_ROOT / "alembic"))
    config.attributes.update(url=url, table=validate.table_name(table), configure_logging=False)
    return config


def upgrade(url: str, revision: str = "head", *, table: str = DEFAULT_TABLE) -> None:
    command.upgrade(alembic_config(url, table=table), revision)


def downgrade(url: str, revision: str, *, table: str = DEFAULT_TABLE) -> None:
    command.downgrade(alembic_config(url, table=table), revision)


def current_revision(url: str, *, table: str = DEFAULT_TABLE) -> str | None:
    """The revision the database is at, or None before the first migration."""
    engine = create_sync_engine(url)
    try:
        with engine.connect() as connection:
            opts = {"version_table": version_table_name(validate.table_name(table))}
            return MigrationContext.configure(connection, opts=opts).get_current_revision()
    finally:
        engine.dispose()
