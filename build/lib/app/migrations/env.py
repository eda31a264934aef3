"""Alembic environment: the URL and table come from the service's own settings.

Programmatic callers (`app.store.migrate`) pass them in `config.attributes` instead. The whole
upgrade runs in one transaction that first takes a migration lock (an advisory lock on
PostgreSQL, the write lock on SQLite), so processes that start together and all migrate
serialise: the first one migrates, the others find the schema at head and do nothing.
"""

from __future__ import annotations

from logging.config import fileConfig

from alembic import context
from sqlalchemy import text

from app.config import Settings
from app.store.engine import create_sync_engine, normalise_url
from app.store.schema import make_metadata, version_table_name

# Any constant works; it only has to be the same for every process migrating this database.
MIGRATION_LOCK_KEY = 0x7E1E6A_0256

config = context.config
if config.attributes.get("configure_logging", True) and config.config_file_name:
    fileConfig(config.config_file_name)

url = config.attributes.get("url")
table = config.attributes.get("table")
if url is None or table is None:
    settings = Settings()
    url = url or settings.database_url
    table = table or settings.table
config.attributes["table"] = table
options = {
    "target_metadata": make_metadata(table),
    "version_table": version_table_name(table),
    "transactional_ddl": True,
}


def run_offline() -> None:
    context.configure(
        url=normalise_url(url, asynchronous=False),
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
        **options,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    engine = create_sync_engine(url)
    try:
        with engine.connect() as connection, connection.begin():
            if connection.dialect.name == "postgresql":
                connection.execute(
                    text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY}
                )
            # On SQLite the BEGIN IMMEDIATE of this transaction already holds the write lock.
            context.configure(connection=connection, render_as_batch=True, **options)
            context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
