"""Commands that run the service: run, serve, worker, migrate, demo-downstream."""

from __future__ import annotations

import argparse
import asyncio
import base64
import logging
import secrets
import shlex
import socket
import sys
from collections.abc import Callable, Coroutine
from typing import Any, TypeAlias

import uvicorn
from pydantic import SecretStr
from starlette.types import ASGIApp

from app import logs, tracing
from app.api_keys import ApiKey
from app.bot_settings import BotOptions, BotSettings
from app.config import Settings
from app.demo import demo_downstream
from app.http.connection_limits import ConnectionLimits
from app.http.server import server_config
from app.privacy.keyfiles import make_own_ring
from app.store import StoreError, migrate
from app.store.engine import normalise_url

log = logging.getLogger(__name__)

Handler = Callable[[Settings, argparse.Namespace], int]
# argparse's subparsers object (its class is not subscriptable at run time).
Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def _migrate(settings: Settings, _args: argparse.Namespace) -> int:
    migrate.upgrade(settings.database_url, table=settings.table)
    revision = migrate.current_revision(settings.database_url, table=settings.table)
    print(f"database at revision {revision}")
    return 0


DEMO_PATH = "/demo/downstream"


def _this_command() -> str:
    """How this program was started, to print commands the reader can paste."""
    started = sys.argv[0]
    return shlex.quote(started) if started.endswith("telegram-intake") else "telegram-intake"


def _demo(settings: Settings, args: argparse.Namespace) -> tuple[Settings, ASGIApp]:
    """Bot `default` with a fresh secret, printed once with a ready curl line, forwarding to
    the demo downstream mounted in the same process, which calls back with a fresh key."""
    secret = secrets.token_urlsafe(24)
    api_key = secrets.token_urlsafe(24)
    signing_secret = "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()
    base = f"http://{args.host}:{args.port}"
    bot = BotSettings(
        name="default",
        secret_token=SecretStr(secret),
        downstream_url=f"{base}{DEMO_PATH}/",
        signing_secret=SecretStr(signing_secret),
        bot_token=settings.bot_token,  # for `run --demo --poll`
    )
    downstream = demo_downstream(
        intake_url=base, api_key=api_key, signing_secret=signing_secret, secret_token=None
    )
    url = f"{base}/telegram/default"
    print(
        f"demo: bot 'default', secret token {secret}\n"
        f"demo: try  curl -s -H 'X-Telegram-Bot-Api-Secret-Token: {secret}' "
        f'-H \'Content-Type: application/json\' -d \'{{"update_id": 1, "message": '
        f'{{"message_id": 1, "date": 0, "chat": {{"id": 42, "type": "private"}}, '
        f'"text": "hello"}}}}\' {url}',
        f"demo: or   INTAKE_SECRET_TOKEN={secret} {_this_command()} send default "
        f"examples/update.json --url {base}",
        f"demo: console  {base}/console  (sign in with this run's one-time key: {api_key})",
        f"demo: metrics  curl -s -H 'Authorization: Bearer {api_key}' {base}/metrics",
        flush=True,
        sep="\n",
    )
    # The journey of each update, from the webhook to the demo downstream, at debug level.
    logging.getLogger("app").setLevel(logging.DEBUG)
    keys = (ApiKey(key=SecretStr(api_key), bots=("default",)),)
    return settings.model_copy(update={"bots": (bot,), "api_keys": keys}), downstream


def _polling(settings: Settings) -> Settings | str:
    """`run --poll`: the bots with a token take their updates by getUpdates (docs/contract.md
    section 11); with none configured, bot `default` from INTAKE_BOT_TOKEN, its webhook secret
    generated (no webhook is used). A problem's words instead when no bot has a token."""
    bots = settings.bots
    if not bots and settings.bot_token is not None:
        options = {
            name: getattr(settings, name)
            for name in BotOptions.model_fields
            if name in settings.model_fields_set
        }
        secret = SecretStr(secrets.token_urlsafe(24))
        bots = (BotSettings(name="default", secret_token=secret, **options),)
    if not any(bot.bot_token is not None for bot in bots):
        return "--poll needs a bot token: set INTAKE_BOT_TOKEN (or bot_token in [[bots]])"
    polled = tuple(
        bot if bot.bot_token is None else bot.model_copy(update={"source": "polling"})
        for bot in bots
    )
    return settings.model_copy(update={"bots": polled})


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


def _encrypted(settings: Settings, *, own_ring: bool) -> Settings | str:
    """The settings a process runs with as to personal data at rest (docs/privacy.md): `run`
    on SQLite with no ring makes one of its own beside the database file (`own_ring`); with
    no ring, a warning that names the terms, or, with require_encryption, the problem's
    words."""
    if settings.key_ring is None and own_ring:
        made = make_own_ring(settings.database_url)
        if made is not None:
            ring, where = made
            log.info(
                "encryption at rest: this SQLite file's key ring is %s (mode 0600; keep it "
                "out of the database's backups)",
                where,
            )
            settings = settings.with_key_ring(ring)
    problem = settings.encryption_problem
    if problem is not None:
        if settings.require_encryption:
            return f"require_encryption: {problem}"
        log.warning("%s", problem)
    return settings


def _serve(settings: Settings, args: argparse.Namespace) -> int:
    mounts: dict[str, ASGIApp] = {}
    listening: list[socket.socket] | None = None
    if args.demo:
        # Bound first: the demo downstream's URL names the port, which `--port 0` leaves open.
        listening = [socket.create_server((args.host, args.port))]
        args.port = listening[0].getsockname()[1]
        settings, mounts[DEMO_PATH] = _demo(settings, args)
    workers = args.command == "run"
    if getattr(args, "poll", False):
        polled = _polling(settings)
        if isinstance(polled, str):
            print(polled, file=sys.stderr)
            return 2
        settings = polled
    problem = _configuration_problem(settings, workers=workers, demo=args.demo)
    problem = problem or _tracing_problem(args.command)
    encrypted = _encrypted(settings, own_ring=workers) if problem is None else problem
    if isinstance(encrypted, str):
        print(encrypted, file=sys.stderr)
        return 2
    settings = encrypted
    if normalise_url(settings.database_url).get_backend_name() == "sqlite":
        # The embedded default migrates itself; PostgreSQL is migrated by the operator.
        migrate.upgrade(settings.database_url, table=settings.table)
    from app.main import create_app
    from app.metrics import Metrics

    metrics = Metrics.of(settings)
    # uvicorn takes SIGTERM from before the app starts, and only sets should_exit: the app's
    # wait for its database asks it, so that a process told to stop does not wait the minute.
    servers: list[uvicorn.Server] = []
    app = create_app(
        settings,
        workers=workers,
        mounts=mounts,
        metrics=metrics,
        stopping=lambda: any(server.should_exit for server in servers),
    )
    limits = ConnectionLimits.of(settings, metrics.connection_closed)
    server = uvicorn.Server(server_config(app, host=args.host, port=args.port, limits=limits))
    servers.append(server)
    server.run(sockets=listening)
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


def _tracing_problem(role: str) -> str | None:
    """Tracing started for this process when the OTEL_* environment asks (`app.tracing`), its
    log lines then carrying their spans' ids; or what is wrong with that environment."""
    try:
        if tracing.start_tracing(role) is not None:
            logs.carry_trace_ids()
    except tracing.TracingMisconfigured as error:
        return f"tracing: {error}"
    return None


def _worker(settings: Settings, _args: argparse.Namespace) -> int:
    problem = _configuration_problem(settings, workers=True, demo=False)
    problem = problem or _tracing_problem("worker")
    encrypted = _encrypted(settings, own_ring=False) if problem is None else problem
    if isinstance(encrypted, str):
        print(encrypted, file=sys.stderr)
        return 2
    settings = encrypted
    from app.worker import run_worker

    try:
        run_loop(run_worker(settings))
    except StoreError as error:
        print(f"worker: {error}", file=sys.stderr)
        return 2
    return 0


def _demo_downstream(settings: Settings, args: argparse.Namespace) -> int:
    bot = settings.bot(args.bot)
    if bot is None:
        print(f"no bot {args.bot!r} is configured", file=sys.stderr)
        return 2
    signing = bot.signing_secret
    token = bot.downstream_secret_token
    if signing is None and token is None:
        print(
            f"bot {bot.name!r} has neither signing_secret nor downstream_secret_token: the "
            "demo downstream could not tell the service's requests from anyone's",
            file=sys.stderr,
        )
        return 2
    key = next(
        (k for k in settings.api_keys if k.allows(bot.name) and "callback" in k.scopes), None
    )
    if key is None:
        print(f"no API key with the callback scope for bot {bot.name!r}", file=sys.stderr)
        return 2
    host = args.host or settings.host
    app = demo_downstream(
        intake_url=args.intake_url,
        api_key=key.key.get_secret_value(),
        signing_secret=None if signing is None else signing.get_secret_value(),
        secret_token=None if token is None else token.get_secret_value(),
    )
    limits = ConnectionLimits.of(settings)
    server = uvicorn.Server(server_config(app, host=host, port=args.port, limits=limits))
    server.run()
    return 0 if server.started else 1


def add_commands(commands: Commands) -> None:
    """run, serve, worker, migrate, demo-downstream."""
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
        if name == "run":
            command.add_argument(
                "--poll",
                action="store_true",
                help="take updates by getUpdates long polling (INTAKE_BOT_TOKEN), not a "
                "webhook: no public HTTPS needed. Example: INTAKE_BOT_TOKEN=... "
                "INTAKE_DOWNSTREAM_URL=http://127.0.0.1:8000/hook telegram-intake run --poll",
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
    demo_command = commands.add_parser(
        "demo-downstream",
        help="serve a small downstream that verifies each forwarded update, checks its "
        "ownership through the callback API and logs it",
        description="Serve the demo downstream: point a bot's downstream_url at it. It verifies "
        "with the bot's signing_secret or downstream_secret_token and calls back with an "
        "INTAKE_API_KEYS key. Example: telegram-intake demo-downstream --port 8081 "
        "--intake-url http://127.0.0.1:8080",
    )
    demo_command.add_argument("--host", help="address to listen on (default: INTAKE_HOST)")
    demo_command.add_argument("--port", type=int, default=8081, help="default: 8081")
    demo_command.add_argument(
        "--intake-url", default="http://127.0.0.1:8080", help="the service, for callbacks"
    )
    demo_command.add_argument("--bot", default="default", help="whose updates it takes")
    demo_command.set_defaults(handler=_demo_downstream)
