"""The `telegram-intake` command line."""

from __future__ import annotations

import argparse
import asyncio
import logging
import secrets
import sys
import tomllib
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import uvicorn
from pydantic import SecretStr, ValidationError

from app.config import BotSettings, Settings, describe
from app.store import StoreError, migrate
from app.store.engine import normalise_url

Handler = Callable[[Settings, argparse.Namespace], int]


def _migrate(settings: Settings, _args: argparse.Namespace) -> int:
    migrate.upgrade(settings.database_url, table=settings.table)
    revision = migrate.current_revision(settings.database_url, table=settings.table)
    print(f"database at revision {revision}")
    return 0


def _demo(settings: Settings, args: argparse.Namespace) -> Settings:
    """Bot `default` with a fresh secret, printed once with a ready curl line."""
    secret = secrets.token_urlsafe(24)
    bot = BotSettings(name="default", secret_token=SecretStr(secret))
    url = f"http://{args.host}:{args.port}/telegram/default"
    print(
        f"demo: bot 'default', secret token {secret}\n"
        f"demo: try  curl -s -H 'X-Telegram-Bot-Api-Secret-Token: {secret}' "
        f'-H \'Content-Type: application/json\' -d \'{{"update_id": 1, "message": '
        f'{{"message_id": 1, "date": 0, "chat": {{"id": 42, "type": "private"}}, '
        f'"text": "hello"}}}}\' {url}',
        flush=True,
    )
    return settings.model_copy(update={"bots": (bot,)})


def _configuration_problem(settings: Settings, *, workers: bool, demo: bool) -> str | None:
    if not settings.bots:
        return (
            "no bot configured: set INTAKE_SECRET_TOKEN, add [[bots]] to intake.toml, "
            "or try `telegram-intake run --demo`"
        )
    missing = [bot.name for bot in settings.bots if bot.downstream_url is None]
    if workers and missing and not demo:
        return (
            f"bots {missing} have no downstream_url: set INTAKE_DOWNSTREAM_URL or "
            "downstream_url in their [[bots]] table (or use `serve`, which only records)"
        )
    return None


def _serve(settings: Settings, args: argparse.Namespace) -> int:
    if args.demo:
        settings = _demo(settings, args)
    workers = args.command == "run"
    problem = _configuration_problem(settings, workers=workers, demo=args.demo)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    if normalise_url(settings.database_url).get_backend_name() == "sqlite":
        # The embedded default migrates itself; PostgreSQL is migrated by the operator.
        migrate.upgrade(settings.database_url, table=settings.table)
    from app.main import create_app, server_config

    app = create_app(settings, workers=workers)
    server = uvicorn.Server(server_config(app, host=args.host, port=args.port))
    server.run()
    return 0 if server.started else 1  # uvicorn has logged why it could not start


def run_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run `main` on uvloop where it is installed, as uvicorn runs `run` and `serve` (and
    PgQueuer's CLI its workers): the dispatcher is bound by event-loop work per update."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is not built for every platform
        asyncio.run(main)
    else:
        uvloop.run(main)


def _worker(settings: Settings, _args: argparse.Namespace) -> int:
    problem = _configuration_problem(settings, workers=True, demo=False)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    from app.worker import run_worker

    try:
        run_loop(run_worker(settings))
    except StoreError as error:
        print(f"worker: {error}", file=sys.stderr)
        return 2
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="telegram-intake", description="Durable webhook intake for Telegram bots."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, summary in (
        ("run", "serve the intake and run the workers in one process (SQLite is migrated)"),
        ("serve", "serve the intake and API only (workers run elsewhere: `worker`)"),
    ):
        command = commands.add_parser(
            name,
            help=summary,
            description=f"{summary[0].upper()}{summary[1:]}. "
            f"Example: telegram-intake {name} --port 8080",
        )
        command.add_argument("--host", help="address to listen on (default: INTAKE_HOST)")
        command.add_argument("--port", type=int, help="port to listen on (default: INTAKE_PORT)")
        command.add_argument(
            "--demo",
            action="store_true",
            help="no configuration needed: bot 'default' with a generated secret, SQLite",
        )
        command.set_defaults(handler=_serve)
    worker_command = commands.add_parser(
        "worker",
        help="run the workers only: claim, forward and settle (many processes may share one "
        "PostgreSQL)",
        description="Run the workers only. Example: INTAKE_DATABASE_URL=postgresql://db/intake "
        "telegram-intake worker",
    )
    worker_command.set_defaults(handler=_worker)
    migrate_command = commands.add_parser(
        "migrate",
        help="migrate the database to the latest revision (= alembic upgrade head)",
        description="Example: INTAKE_DATABASE_URL=postgresql://db/intake telegram-intake migrate",
    )
    migrate_command.set_defaults(handler=_migrate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # --help needs no valid configuration
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        settings = Settings()
    except ValidationError as error:
        print(describe(error), file=sys.stderr)
        return 2
    except (OSError, tomllib.TOMLDecodeError) as error:
        print(f"invalid configuration: {error}", file=sys.stderr)
        return 2
    if hasattr(args, "host"):
        args.host = args.host or settings.host
        args.port = settings.port if args.port is None else args.port
    handler: Handler = args.handler
    return handler(settings, args)


if __name__ == "__main__":
    sys.exit(main())
