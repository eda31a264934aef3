"""Operator control from the command line (docs/contract.md section 9): bots, pause, resume,
rate-limit, replay, updates, attempts, park, audit; `exhaustions redrive|ack` by filter are
`app.cli.exhaustion_actions`.

Like the other operator commands they work on the database the service uses, whether the
service runs or not, through the same store methods as the API: a pause binds every worker
process at its commit, and every action is recorded in the audit log, under `cli:USER@HOST`.
`--json` prints what a script would read.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
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
    telegram_id_argument,
    time_text,
    vars_of,
    when_argument,
)
from app.config import Settings
from app.overview import bots_overview
from app.store import ClaimIdentity, OperatorStore, StoredDelivery, StoredUpdate, UpdateFilter
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
        name = _named(args)
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
            return f"resumed {_named(args)}"
        return f"{_named(args)} was not paused"

    return _bot_action(settings, args.bot, resume)


def _rate_limit(settings: Settings, args: argparse.Namespace) -> int:
    async def limit(store: OperatorStore, now: int) -> str:
        await store.set_rate_limit(
            args.bot, args.rate, at=now, by=actor(), destination=args.destination
        )
        limit = "no limit" if args.rate is None else f"at most {args.rate:g} attempts/s"
        return f"{_named(args)}: {limit}, across every worker process"

    return _bot_action(settings, args.bot, limit)


DESTINATION_HELP = (
    "one destination beside default (docs/destinations.md); without it, the bot (a pause "
    "holds every destination of it)"
)


def _destination_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--destination",
        type=destination_argument,
        default=DEFAULT_DESTINATION,
        help=DESTINATION_HELP,
    )


def _named(args: argparse.Namespace) -> str:
    """The bot an action is on, or bot/destination."""
    if args.destination == DEFAULT_DESTINATION:
        return str(args.bot)
    return f"{args.bot}/{args.destination}"


def _replay(settings: Settings, args: argparse.Namespace) -> int:
    if not known_bot(settings, args.bot):
        return 2
    targets = settings.bot(args.bot).targets  # type: ignore[union-attr]  # known
    target = next((t for t in targets if t.name == args.destination), None)
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


# -- updates and attempts ------------------------------------------------------------------------


def _updates(settings: Settings, args: argparse.Namespace) -> int:
    names = [args.bot] if args.bot else [bot.name for bot in settings.bots]
    if args.bot and not known_bot(settings, args.bot):
        return 2
    chosen = UpdateFilter(
        bots=tuple(names),
        state=args.state,
        chat=args.chat,
        update_type=args.type,
        received_after=args.received_after,
        received_before=args.received_before,
        contains=args.contains,
        user=None if args.user is None else str(args.user),
        destination=args.destination,
    )

    async def work(store: OperatorStore) -> int:
        page = await store.search_updates(chosen, after=None, limit=args.limit)
        cursor, items = page.next, list(page.items)
        while cursor is not None and len(items) < args.limit:  # a body search pages on
            page = await store.search_updates(chosen, after=cursor, limit=args.limit - len(items))
            cursor, items = page.next, items + page.items
        if args.json:
            print_json([vars_of(item) for item in items])
            return 0
        if not items:
            print("no update matches")
            return 0
        print(
            table(
                [
                    "BOT",
                    "UPDATE_ID",
                    "STATE",
                    "ATTEMPTS",
                    "TYPE",
                    "CHAT",
                    "RECEIVED (UTC)",
                    "ERROR",
                ],
                [
                    [
                        u.bot,
                        u.update_id,
                        u.state,
                        u.attempts,
                        u.update_type or "-",
                        u.queue_key or "-",
                        time_text(u.received_at),
                        (u.error or "")[:50],
                    ]
                    for u in items
                ],
            )
        )
        return 0

    return run_on_store(settings, work)


def _attempts(settings: Settings, args: argparse.Namespace) -> int:
    async def work(store: OperatorStore) -> int:
        records = await store.attempt_history(
            args.bot, args.update_id, destination=args.destination
        )
        if records is None:
            print(f"no update {args.update_id} of bot {args.bot!r} is recorded", file=sys.stderr)
            return 1
        if args.json:
            print_json([{**vars_of(r), "duration_ms": r.duration_ms} for r in records])
            return 0
        if not records:
            print("no attempt yet")
            return 0
        print(
            table(
                [
                    "ATTEMPT",
                    "OUTCOME",
                    "STATUS",
                    "STARTED (UTC)",
                    "MS",
                    "WORKER",
                    "CLAIM_ID",
                    "ERROR",
                ],
                [
                    [
                        r.attempt,
                        r.outcome,
                        r.status_code or "-",
                        time_text(r.started_at),
                        "-" if r.duration_ms is None else r.duration_ms,
                        r.worker or "-",
                        r.claim_id,
                        (r.error or "")[:40],
                    ]
                    for r in records
                ],
            )
        )
        return 0

    return run_on_store(settings, work)


def _park(settings: Settings, args: argparse.Namespace) -> int:
    async def work(store: OperatorStore) -> int:
        found = await store.get_update(args.bot, args.update_id)
        row: StoredUpdate | StoredDelivery | None = found
        if found is not None and args.destination != DEFAULT_DESTINATION:
            row = next(
                (d for d in found.deliveries or () if d.destination == args.destination), None
            )
        if row is None or row.claim_id is None or row.state not in ("processing", "failed"):
            state = "not recorded" if row is None else row.state
            print(
                f"update {args.update_id} of {_named(args)!r} has no attempt to park ({state})",
                file=sys.stderr,
            )
            return 1
        identity = ClaimIdentity(
            args.bot, args.update_id, row.attempts, row.claim_id, args.destination
        )
        now = await store.database_time()
        if await store.park(identity, at=now, by=actor(), reason=args.reason):
            print(f"parked {args.bot}:{args.update_id} attempt {identity.attempt} as an exhaustion")
            return 0
        print("its attempt changed meanwhile; look again and retry", file=sys.stderr)
        return 1

    return run_on_store(settings, work)


def _audit(settings: Settings, args: argparse.Namespace) -> int:
    async def work(store: OperatorStore) -> int:
        entries = await store.audit_log(after=args.after, limit=args.limit)
        if args.json:
            print_json([vars_of(e) | {"detail": json.loads(e.detail or "null")} for e in entries])
            return 0
        if not entries:
            print("no operator action recorded")
            return 0
        print(
            table(
                ["ID", "AT (UTC)", "KEY", "ACTION", "TARGET", "MATCHED", "DETAIL"],
                [
                    [
                        e.id,
                        time_text(e.at),
                        e.key_name,
                        e.action,
                        e.target,
                        "-" if e.matched is None else e.matched,
                        (e.detail or "")[:60],
                    ]
                    for e in entries
                ],
            )
        )
        return 0

    return run_on_store(settings, work)


def add_commands(commands: Commands) -> None:
    """bots, pause, resume, rate-limit, replay, updates, attempts, park, audit."""
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
    _destination_option(pause)
    pause.set_defaults(handler=_pause)
    resume = commands.add_parser(
        "resume",
        help="deliver a paused bot's updates again",
        description="Example: telegram-intake resume shop",
    )
    resume.add_argument("bot", type=bot_argument)
    _destination_option(resume)
    resume.set_defaults(handler=_resume)
    rate = commands.add_parser(
        "rate-limit",
        help="at most N attempts per second for a bot, across every worker process",
        description="Example: telegram-intake rate-limit shop 20; telegram-intake rate-limit "
        "shop off",
    )
    rate.add_argument("bot", type=bot_argument)
    rate.add_argument("rate", type=rate_argument, help="attempts per second, or off")
    _destination_option(rate)
    rate.set_defaults(handler=_rate_limit)
    updates = commands.add_parser(
        "updates",
        help="search recorded updates, newest first",
        description="Example: telegram-intake updates --bot shop --state failed --chat 12345",
    )
    updates.add_argument("--bot", type=bot_argument, help="one bot only")
    updates.add_argument("--state", choices=STATES)
    updates.add_argument(
        "--chat", help="the queue key (Telegram's queue: a chat's id for its messages)"
    )
    updates.add_argument("--type", help="the update type")
    updates.add_argument("--received-after", type=when_argument, help="at or after (ISO/ms)")
    updates.add_argument("--received-before", type=when_argument, help="before (ISO/ms)")
    updates.add_argument("--contains", help="a substring of the raw update")
    updates.add_argument(
        "--user",
        type=telegram_id_argument,
        help="a user's or chat's id named anywhere in the update (sender, member, reply...)",
    )
    updates.add_argument(
        "--destination",
        type=destination_argument,
        help="each update as this destination sees it: its delivery's state and attempts",
    )
    updates.add_argument("--limit", type=int, default=50, help="rows (default 50)")
    updates.add_argument("--json", action="store_true", help="print JSON")
    updates.set_defaults(handler=_updates)
    attempts = commands.add_parser(
        "attempts",
        help="every attempt of one update: outcome, HTTP status, duration, worker",
        description="Example: telegram-intake attempts shop 123456",
    )
    attempts.add_argument("bot", type=bot_argument)
    attempts.add_argument("update_id", type=int)
    attempts.add_argument("--json", action="store_true", help="print JSON")
    _destination_option(attempts)
    attempts.set_defaults(handler=_attempts)
    park = commands.add_parser(
        "park",
        help="end a poison update's current attempt as an exhaustion, freeing its chat",
        description="Example: telegram-intake park shop 123456 --reason 'crashes the handler'",
    )
    park.add_argument("bot", type=bot_argument)
    park.add_argument("update_id", type=int)
    park.add_argument("--reason", required=True, help="kept as the exhaustion's error")
    _destination_option(park)
    park.set_defaults(handler=_park)
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
    audit = commands.add_parser(
        "audit",
        help="operator actions, newest first: who, what, which, how many",
        description="Example: telegram-intake audit --limit 20",
    )
    audit.add_argument("--after", type=int, help="older than this id (the next page)")
    audit.add_argument("--limit", type=int, default=50, help="rows (default 50)")
    audit.add_argument("--json", action="store_true", help="print JSON")
    audit.set_defaults(handler=_audit)
