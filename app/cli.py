"""The `telegram-intake` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import uvicorn

from app.config import Settings
from app.store import migrate
from app.store.engine import normalise_url


def _migrate(settings: Settings, _args: argparse.Namespace) -> int:
    migrate.upgrade(settings.database_url, table=settings.table)
    revision = migrate.current_revision(settings.database_url, table=settings.table)
    print(f"database at revision {revision}")
    return 0


def _run(settings: Settings, args: argparse.Namespace) -> int:
    if normalise_url(settings.database_url).get_backend_name() == "sqlite":
        # The embedded default migrates itself; PostgreSQL is migrated by the operator.
        migrate.upgrade(settings.database_url, table=settings.table)
    from app.main import create_app

    uvicorn.run(create_app(settings), host=args.host, port=args.port, log_level="info")
    return 0


def build_parser(settings: Settings) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="telegram-intake",
        description="Durable webhook intake for Telegram bots.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = commands.add_parser(
        "run",
        help="serve the intake (SQLite databases are migrated at start)",
        description="Serve the intake. Example: telegram-intake run --port 8080",
    )
    run.add_argument("--host", default=settings.host, help="address to listen on")
    run.add_argument("--port", type=int, default=settings.port, help="port to listen on")
    run.set_defaults(handler=_run)
    migrate_parser = commands.add_parser(
        "migrate",
        help="migrate the database to the latest revision (= alembic upgrade head)",
        description="Example: INTAKE_DATABASE_URL=postgresql://db/intake telegram-intake migrate",
    )
    migrate_parser.set_defaults(handler=_migrate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    settings = Settings()
    args = build_parser(settings).parse_args(argv)
    return int(args.handler(settings, args))


if __name__ == "__main__":
    sys.exit(main())
