"""Run Alembic from Python: `telegram-intake migrate`, SQLite auto-migration and the tests.

Equivalent to `alembic upgrade head` with INTAKE_DATABASE_URL set; concurrent callers
serialise on a migration lock (see alembic/env.py).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext

from app.store import validate
from app.store.engine import create_sync_engine
from app.store.schema import DEFAULT_TABLE, version_table_name

PROJECT_ROOT = Path(__file__).resolve().parents[2]
ALEMBIC_INI = PROJECT_ROOT / "alembic.ini"


def script_location() -> Path:
    """The migration scripts: `alembic/` of a checkout, or `app.migrations` of an installed
    wheel (the same files; pyproject.toml maps one onto the other)."""
    checkout = PROJECT_ROOT / "alembic"
    if (checkout / "env.py").is_file():
        return checkout
    spec = importlib.util.find_spec("app.migrations")  # a namespace package: no __init__.py
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("no migration scripts: neither alembic/ nor app.migrations")
    return Path(next(iter(spec.submodule_search_locations)))


def alembic_config(url: str, *, table: str = DEFAULT_TABLE) -> Config:
    """An Alembic config bound to this database and table, leaving logging alone."""
    config = Config(str(ALEMBIC_INI) if ALEMBIC_INI.is_file() else None)
    config.set_main_option("script_location", str(script_location()))
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
