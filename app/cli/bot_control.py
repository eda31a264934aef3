"""Operator control of whole bots and their destinations from the command line (docs/contract.md
section 9, docs/destinations.md): bots, pause, resume, rate-limit, replay. Like every operator
command they work on the database the service uses, through the same store methods as the API,
audited under `cli:USER@HOST`.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Awaitable, Callable

from app.cli.operations import run_on_store
from app.cli.service import Commands
from app.cli.terminal import (
    actor,
    age_text,
    bot_argument,
    destination_argument,
    known_bot,
    print_json,
    rate_argument,
    table,
)
from app.config import Settings
from app.overview import bots_overview
from app.store import OperatorStore
from app.store.types import DEFAULT_DESTINATION, STATES

# -- bots --------------------------------------------------------------------------------------


def _bots(settings: Settings, args: argparse.Namespace) -> int:
    async def work(store: OperatorStore) -> int:
        names = [bot.name for bot in settings.bots]
        found = await bots_overview(store, settings, names, await store.database_time())
        rows = [dataclasses.asdict(bot) for bot in found]
        if args.json:
            print_json(rows)
            return 0
        head = ["BOT", "STATUS", "RATE/S", *(s.upper() for s in STATES), "OPEN EXH.", "OLDEST"]
        print(
            table(
                head,
                [
                    [
                        row["bot"],
                        f"paused by {row['paused_by']}" if row["paused"] else "running",
                        row["rate_limit_per_second"] or "-",
                        *(row["counts"].get(state, 0) for state in STATES),
                        row["open_exhaustions"],
                        age_text(row["oldest_undelivered_age_ms"]),
                    ]
                    for row in rows
                ],
            )
        )
        return 0

    return run_on_store(settings, work)


def _bot_action(
    settings: Settings, bot: str, act: Callable[[OperatorStore, int], Awaitable[str]]
) -> int:
    """Run one action on a configured bot at the database's now and print what it did."""
    if not known_bot(settings, bot):
        return 2

    async def work(store: OperatorStore) -> int:
        print(await act(store, await store.database_time()))
        return 0

    return run_on_store(settings, work)


def _pause(settings: Settings, args: argparse.Namespace) -> int:
    async def pause(store: OperatorStore, now: int) -> str:
        name = named(args)
        paused = await store.pause(
            args.bot, at=now, by=actor(), reason=args.reason, destination=args.destination
        )
        if paused:
            return f"paused {name}: no new attempts in any process; updates are still recorded"
        return f"{name} was paused already"

    return _bot_action(settings, args.bot, pause)


def _resume(settings: Settings, args: argparse.Namespace) -> int:
    async def resume(store: OperatorStore, now: int) -> str:
        if await store.resume(args.bot, at=now, by=actor(), destination=args.destination):
            return f"resumed {named(args)}"
        return f"{named(args)} was not paused"

    return _bot_action(settings, args.bot, resume)


def _rate_limit(settings: Settings, args: argparse.Namespace) -> int:
    async def limit(store: OperatorStore, now: int) -> str:
        await store.set_rate_limit(
            args.bot, args.rate, at=now, by=actor(), destination=args.destination
        )
        limit = "no limit" if args.rate is None else f"at most {args.rate:g} attempts/s"
        return f"{named(args)}: {limit}, across every worker process"

    return _bot_action(settings, args.bot, limit)


DESTINATION_HELP = (
    "one destination beside default (docs/destinations.md); without it, the bot (a pause "
    "holds every destination of it)"
)


def destination_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--destination",
        type=destination_argument,
        default=DEFAULT_DESTINATION,
        help=DESTINATION_HELP,
    )


def named(args: argparse.Namespace) -> str:
    """The bot an action is on, or bot/destination."""
    if args.destination == DEFAULT_DESTINATION:
        return str(args.bot)
    return f"{args.bot}/{args.destination}"


def _replay(settings: Settings, args: argparse.Namespace) -> int:
    if not known_bot(settings, args.bot):
        return 2
    target = settings.bot(args.bot).target(args.destination)  # type: ignore[union-attr]  # known
    if target is None:
        print(f"bot {args.bot!r} has no destination {args.destination!r}", file=sys.stderr)
        return 2

    async def work(store: OperatorStore) -> int:
        try:
            count = await store.replay(
                args.bot,
                args.destination,
                first=args.first,
                last=args.last,
                ordered=target.ordered,
                at=await store.database_time(),
                by=actor(),
                dry_run=args.dry_run,
            )
        except ValueError as error:
            print(f"nothing replayed: {error}", file=sys.stderr)
            return 1
        span = f"updates {args.first}-{args.last} of {args.bot} to {args.destination}"
        if args.dry_run:
            print(f"would replay {count} {span} (dry run: nothing changed)")
        else:
            print(f"replayed {count} {span}: each due now")
        return 0

    return run_on_store(settings, work)


def add_commands(commands: Commands) -> None:
    """bots, pause, resume, rate-limit, replay."""
    bots = commands.add_parser(
        "bots",
        help="every bot: running or paused, rate limit, counts by state, open exhaustions",
        description="Example: telegram-intake bots --json",
    )
    bots.add_argument("--json", action="store_true", help="print JSON")
    bots.set_defaults(handler=_bots)
    pause = commands.add_parser(
        "pause",
        help="hold a bot's deliveries in every process (updates are still recorded)",
        description="Example: telegram-intake pause shop --reason 'downstream maintenance'",
    )
    pause.add_argument("bot", type=bot_argument)
    pause.add_argument("--reason", help="recorded with the pause and in the audit log")
    destination_option(pause)
    pause.set_defaults(handler=_pause)
    resume = commands.add_parser(
        "resume",
        help="deliver a paused bot's updates again",
        description="Example: telegram-intake resume shop",
    )
    resume.add_argument("bot", type=bot_argument)
    destination_option(resume)
    resume.set_defaults(handler=_resume)
    rate = commands.add_parser(
        "rate-limit",
        help="at most N attempts per second for a bot, across every worker process",
        description="Example: telegram-intake rate-limit shop 20; telegram-intake rate-limit "
        "shop off",
    )
    rate.add_argument("bot", type=bot_argument)
    rate.add_argument("rate", type=rate_argument, help="attempts per second, or off")
    destination_option(rate)
    rate.set_defaults(handler=_rate_limit)
    replay = commands.add_parser(
        "replay",
        help="deliver a range of updates to a destination that never had them",
        description="Example: telegram-intake replay shop --destination payments --from 1000 "
        "--to 2000 --dry-run",
    )
    replay.add_argument("bot", type=bot_argument)
    replay.add_argument("--destination", type=destination_argument, required=True)
    replay.add_argument("--from", dest="first", type=int, required=True, help="first update id")
    replay.add_argument("--to", dest="last", type=int, required=True, help="last update id")
    replay.add_argument("--dry-run", action="store_true", help="count them, change nothing")
    replay.set_defaults(handler=_replay)
