"""The `telegram-intake` command line: one argparse parser, a module per group of commands.

- `app.cli.service`: run, serve, worker, migrate, demo-downstream;
- `app.cli.telegram`: set-webhook, webhook-info (the Bot API);
- `app.cli.operations`: exhaustions list, stats, send;
- `app.cli.bot_control`: operator control of bots and destinations: bots, pause, resume,
  rate-limit, replay;
- `app.cli.control`: operator control of updates: updates, attempts, park, audit;
- `app.cli.exhaustion_actions`: exhaustions redrive|ack;
- `app.cli.terminal`: what the operator commands share: arguments, the actor, tables and JSON.

Every handler takes the validated settings and the parsed arguments and returns the exit code:
0 done, 1 the operation failed (Telegram refused, nothing matched), 2 bad configuration.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from collections.abc import Sequence

from pydantic import ValidationError

from app import logs
from app.cli import (
    bot_control,
    control,
    exhaustion_actions,
    operations,
    privacy,
    service,
    telegram,
)
from app.cli.service import Handler, run_loop
from app.config import Settings, describe

__all__ = ["build_parser", "main", "run_loop"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="telegram-intake",
        description="Durable webhook intake for Telegram bots. Settings come from INTAKE_* "
        "variables and ./intake.toml (or INTAKE_CONFIG).",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    service.add_commands(commands)
    telegram.add_commands(commands)
    exhaustions = operations.add_commands(commands)
    exhaustion_actions.add_exhaustion_actions(exhaustions)
    bot_control.add_commands(commands)
    control.add_commands(commands)
    privacy.add_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # --help needs no valid configuration
    try:
        settings = Settings()
    except ValidationError as error:
        print(describe(error), file=sys.stderr)
        return 2
    except (OSError, tomllib.TOMLDecodeError) as error:
        print(f"invalid configuration: {error}", file=sys.stderr)
        return 2
    logs.configure(settings.log_format, settings.log_level.upper())
    if args.command in ("run", "serve"):
        args.host = args.host or settings.host
        args.port = settings.port if args.port is None else args.port
    handler: Handler = args.handler
    return handler(settings, args)
