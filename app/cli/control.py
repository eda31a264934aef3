"""Operator control from the command line (SPEC section 9): bots, pause, resume, rate-limit,
updates, attempts, park, audit, and `exhaustions redrive|ack` by filter.

Like the other operator commands they work on the database the service uses, whether the
service runs or not, through the same store methods as the API: a pause binds every worker
process at its commit, and every action is recorded in the audit log, under `cli:USER@HOST`.
`--json` prints what a script would read.
"""

from __future__ import annotations

import argparse
import dataclasses
import getpass
import json
import socket
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from app.cli.operations import _age, _run, _time, table
from app.cli.service import Commands
from app.config import Settings
from app.overview import bots_overview
from app.store import (
    BulkOutcome,
    ClaimIdentity,
    ExhaustionFilter,
    OperatorStore,
    UpdateFilter,
    validate,
)
from app.store.types import STATES

SubCommands = Any  # argparse's private _SubParsersAction


def actor() -> str:
    """Who a command's actions are recorded as in the audit log."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"cli:{user}@{socket.gethostname()}"[:200]


def _when(value: str) -> int:
    """An epoch-ms integer or an ISO 8601 time (UTC unless it says otherwise)."""
    if value.isdigit():
        return int(value)
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is neither epoch milliseconds nor an ISO 8601 time"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def _bot(value: str) -> str:
    try:
        return validate.bot_name(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _rate(value: str) -> float | None:
    if value == "off":
        return None
    return _pace(value, "a number or 'off'")


def _pace(value: str, wanted: str = "a number") -> float:
    try:
        rate = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not {wanted}") from None
    if not validate.MIN_RATE <= rate <= validate.MAX_RATE:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not in [{validate.MIN_RATE}, {validate.MAX_RATE}] per second"
        )
    return rate


def _known(settings: Settings, bot: str) -> bool:
    if settings.bot(bot) is None:
        print(f"no bot {bot!r} is configured", file=sys.stderr)
        return False
    return True


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True))


# -- bots --------------------------------------------------------------------------------------


def _bots(settings: Settings, args: argparse.Namespace) -> int:
    async def work(store: OperatorStore) -> int:
        names = [bot.name for bot in settings.bots]
        found = await bots_overview(store, settings, names, await store.database_time())
        rows = [dataclasses.asdict(bot) for bot in found]
        if args.json:
            _print_json(rows)
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
                        _age(row["oldest_undelivered_age_ms"]),
                    ]
                    for row in rows
                ],
            )
        )
        return 0

    return _run(settings, work)


def _bot_action(
    settings: Settings, bot: str, act: Callable[[OperatorStore, int], Awaitable[str]]
) -> int:
    """Run one action on a configured bot at the database's now and print what it did."""
    if not _known(settings, bot):
        return 2

    async def work(store: OperatorStore) -> int:
        print(await act(store, await store.database_time()))
        return 0

    return _run(settings, work)


def _pause(settings: Settings, args: argparse.Namespace) -> int:
    async def pause(store: OperatorStore, now: int) -> str:
        if await store.pause(args.bot, at=now, by=actor(), reason=args.reason):
            return f"paused {args.bot}: no new attempts in any process; updates are still recorded"
        return f"{args.bot} was paused already"

    return _bot_action(settings, args.bot, pause)


def _resume(settings: Settings, args: argparse.Namespace) -> int:
    async def resume(store: OperatorStore, now: int) -> str:
        if await store.resume(args.bot, at=now, by=actor()):
            return f"resumed {args.bot}"
        return f"{args.bot} was not paused"

    return _bot_action(settings, args.bot, resume)


def _rate_limit(settings: Settings, args: argparse.Namespace) -> int:
    async def limit(store: OperatorStore, now: int) -> str:
        await store.set_rate_limit(args.bot, args.rate, at=now, by=actor())
        limit = "no limit" if args.rate is None else f"at most {args.rate:g} attempts/s"
        return f"{args.bot}: {limit}, across every worker process"

    return _bot_action(settings, args.bot, limit)


# -- updates and attempts ------------------------------------------------------------------------


def _updates(settings: Settings, args: argparse.Namespace) -> int:
    names = [args.bot] if args.bot else [bot.name for bot in settings.bots]
    if args.bot and not _known(settings, args.bot):
        return 2
    chosen = UpdateFilter(
        bots=tuple(names),
        state=args.state,
        chat=args.chat,
        update_type=args.type,
        received_after=args.received_after,
        received_before=args.received_before,
        contains=args.contains,
    )

    async def work(store: OperatorStore) -> int:
        page = await store.search_updates(chosen, after=None, limit=args.limit)
        cursor, items = page.next, list(page.items)
        while cursor is not None and len(items) < args.limit:  # a body search pages on
            page = await store.search_updates(chosen, after=cursor, limit=args.limit - len(items))
            cursor, items = page.next, items + page.items
        if args.json:
            _print_json([vars_of(item) for item in items])
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
                        _time(u.received_at),
                        (u.error or "")[:50],
                    ]
                    for u in items
                ],
            )
        )
        return 0

    return _run(settings, work)


def vars_of(value: Any) -> dict[str, Any]:
    return {name: getattr(value, name) for name in value.__dataclass_fields__}


def _attempts(settings: Settings, args: argparse.Namespace) -> int:
    async def work(store: OperatorStore) -> int:
        records = await store.attempt_history(args.bot, args.update_id)
        if records is None:
            print(f"no update {args.update_id} of bot {args.bot!r} is recorded", file=sys.stderr)
            return 1
        if args.json:
            _print_json([{**vars_of(r), "duration_ms": r.duration_ms} for r in records])
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
                        _time(r.started_at),
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

    return _run(settings, work)


def _park(settings: Settings, args: argparse.Namespace) -> int:
    async def work(store: OperatorStore) -> int:
        row = await store.get_update(args.bot, args.update_id)
        if row is None or row.claim_id is None or row.state not in ("processing", "failed"):
            state = "not recorded" if row is None else row.state
            print(
                f"update {args.update_id} of {args.bot!r} has no attempt to park ({state})",
                file=sys.stderr,
            )
            return 1
        identity = ClaimIdentity(row.bot, row.update_id, row.attempts, row.claim_id)
        now = await store.database_time()
        if await store.park(identity, at=now, by=actor(), reason=args.reason):
            print(f"parked {args.bot}:{args.update_id} attempt {identity.attempt} as an exhaustion")
            return 0
        print("its attempt changed meanwhile; look again and retry", file=sys.stderr)
        return 1

    return _run(settings, work)


def _audit(settings: Settings, args: argparse.Namespace) -> int:
    async def work(store: OperatorStore) -> int:
        entries = await store.audit_log(after=args.after, limit=args.limit)
        if args.json:
            _print_json([vars_of(e) | {"detail": json.loads(e.detail or "null")} for e in entries])
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
                        _time(e.at),
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

    return _run(settings, work)


# -- exhaustions in bulk ----------------------------------------------------------------------


def _selection(
    settings: Settings, args: argparse.Namespace, *, configured: bool = False
) -> ExhaustionFilter | list[ClaimIdentity] | None:
    """The filter or identity the arguments name; None (and a message) when they name none.
    With `configured`, a filter without --bot covers the configured bots only (a redriven
    update of a bot no worker serves would never be delivered)."""
    if args.identity:
        if len(args.identity) != 4:
            print("an identity is BOT UPDATE_ID ATTEMPT CLAIM_ID", file=sys.stderr)
            return None
        bot, update_id, attempt, claim_id = args.identity
        try:
            return [ClaimIdentity(bot, int(update_id), int(attempt), claim_id)]
        except ValueError as error:
            print(f"not an identity: {error}", file=sys.stderr)
            return None
    chosen = ExhaustionFilter(
        bots=(args.bot,)
        if args.bot is not None
        else tuple(bot.name for bot in settings.bots)
        if configured
        else None,
        update_type=args.type,
        chat=args.chat,
        error_contains=args.error_contains,
        exhausted_after=args.exhausted_after,
        exhausted_before=args.exhausted_before,
    )
    criteria = (args.bot, args.type, args.chat, args.error_contains)
    named = any(c is not None for c in (*criteria, args.exhausted_after, args.exhausted_before))
    if not named and not (args.all or args.dry_run):
        print(
            "name what to act on (a filter or an identity), or pass --all to act on every "
            "open exhaustion",
            file=sys.stderr,
        )
        return None
    return chosen


def _report(outcome: BulkOutcome, verb: str, args: argparse.Namespace) -> None:
    if args.json:
        _print_json(
            {
                "matched": outcome.matched,
                verb: outcome.changed,  # as the API answers: "redriven" or "acknowledged"
                "sample": [vars_of(e.identity) for e in outcome.sample],
            }
        )
        return
    if args.dry_run:
        print(f"dry run: {outcome.matched} open exhaustions would be {verb}")
    else:
        print(f"{verb} {outcome.changed} of {outcome.matched} open exhaustions")
    for exhaustion in outcome.sample:
        i = exhaustion.identity
        print(f"  {i.bot}:{i.update_id} attempt {i.attempt}: {(exhaustion.error or '')[:60]}")


def _progress(args: argparse.Namespace) -> Callable[[int], None] | None:
    if args.json:
        return None
    return lambda done: print(f"... {done} so far", file=sys.stderr, flush=True)


def _redrive(settings: Settings, args: argparse.Namespace) -> int:
    named = [args.bot] if args.bot else []
    if args.identity:
        named.append(args.identity[0])
    if not all(_known(settings, bot) for bot in named):
        return 2  # no worker would deliver a redriven update of a bot not configured
    selection = _selection(settings, args, configured=True)
    if selection is None:
        return 2

    async def work(store: OperatorStore) -> int:
        now = await store.database_time()
        outcome = await store.redrive(
            selection,
            at=now,
            by=actor(),
            dry_run=args.dry_run,
            rate_per_second=args.rate,
            progress=_progress(args),
        )
        _report(outcome, "redriven", args)
        return 0

    return _run(settings, work)


def _acknowledge(settings: Settings, args: argparse.Namespace) -> int:
    selection = _selection(settings, args)
    if selection is None:
        return 2

    async def work(store: OperatorStore) -> int:
        now = await store.database_time()
        outcome = await store.acknowledge_exhaustions(
            selection, at=now, by=actor(), dry_run=args.dry_run, progress=_progress(args)
        )
        if not isinstance(selection, list) or args.json or args.dry_run:
            _report(outcome, "acknowledged", args)
            return 0
        identity = selection[0]
        if outcome.changed:
            print(f"acknowledged {identity.bot}:{identity.update_id} attempt {identity.attempt}")
            return 0
        print(
            "no open exhaustion has exactly this identity (already acknowledged, or a field "
            "differs: see `telegram-intake exhaustions list`)",
            file=sys.stderr,
        )
        return 1

    return _run(settings, work)


def _filter_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("identity", nargs="*", help="BOT UPDATE_ID ATTEMPT CLAIM_ID: exactly one")
    parser.add_argument("--bot", type=_bot, help="one bot's exhaustions")
    parser.add_argument("--type", help="of this update type (message, callback_query, ...)")
    parser.add_argument(
        "--chat", help="of this queue key (Telegram's queue: a chat's id for its messages)"
    )
    parser.add_argument("--error-contains", help="whose error holds this text")
    parser.add_argument("--exhausted-after", type=_when, help="exhausted at or after (ISO/ms)")
    parser.add_argument("--exhausted-before", type=_when, help="exhausted before (ISO/ms)")
    parser.add_argument("--all", action="store_true", help="every open exhaustion (no filter)")
    parser.add_argument("--dry-run", action="store_true", help="count and sample; change nothing")
    parser.add_argument("--json", action="store_true", help="print JSON")


def add_exhaustion_actions(actions: SubCommands) -> None:
    """`exhaustions redrive` and `exhaustions ack`, under `exhaustions`."""
    redrive = actions.add_parser(
        "redrive",
        help="deliver open exhaustions again, paced, with a fresh attempt budget",
        description="Each selected exhaustion becomes due again with a fresh budget; its "
        "attempt numbers go on. Example: telegram-intake exhaustions redrive --bot shop "
        "--error-contains 'HTTP 500' --dry-run, then again without --dry-run --rate 50",
    )
    _filter_arguments(redrive)
    redrive.add_argument(
        "--rate", type=_pace, help="pace at this many updates per second (default: at once)"
    )
    redrive.set_defaults(handler=_redrive)
    ack = actions.add_parser(
        "ack",
        help="acknowledge exhaustions (one by its exact identity, or by filter): prunable",
        description="Examples: telegram-intake exhaustions ack shop 123456 8 "
        "0f9c3e9e-8a53-4c39-9d5e-2d6f3c1b7a10; telegram-intake exhaustions ack --bot shop "
        "--type edited_message --dry-run",
    )
    _filter_arguments(ack)
    ack.set_defaults(handler=_acknowledge)


def add_commands(commands: Commands) -> None:
    """bots, pause, resume, rate-limit, updates, attempts, park, audit."""
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
    pause.add_argument("bot", type=_bot)
    pause.add_argument("--reason", help="recorded with the pause and in the audit log")
    pause.set_defaults(handler=_pause)
    resume = commands.add_parser(
        "resume",
        help="deliver a paused bot's updates again",
        description="Example: telegram-intake resume shop",
    )
    resume.add_argument("bot", type=_bot)
    resume.set_defaults(handler=_resume)
    rate = commands.add_parser(
        "rate-limit",
        help="at most N attempts per second for a bot, across every worker process",
        description="Example: telegram-intake rate-limit shop 20; telegram-intake rate-limit "
        "shop off",
    )
    rate.add_argument("bot", type=_bot)
    rate.add_argument("rate", type=_rate, help="attempts per second, or off")
    rate.set_defaults(handler=_rate_limit)
    updates = commands.add_parser(
        "updates",
        help="search recorded updates, newest first",
        description="Example: telegram-intake updates --bot shop --state failed --chat 12345",
    )
    updates.add_argument("--bot", type=_bot, help="one bot only")
    updates.add_argument("--state", choices=STATES)
    updates.add_argument(
        "--chat", help="the queue key (Telegram's queue: a chat's id for its messages)"
    )
    updates.add_argument("--type", help="the update type")
    updates.add_argument("--received-after", type=_when, help="at or after (ISO/ms)")
    updates.add_argument("--received-before", type=_when, help="before (ISO/ms)")
    updates.add_argument("--contains", help="a substring of the raw update")
    updates.add_argument("--limit", type=int, default=50, help="rows (default 50)")
    updates.add_argument("--json", action="store_true", help="print JSON")
    updates.set_defaults(handler=_updates)
    attempts = commands.add_parser(
        "attempts",
        help="every attempt of one update: outcome, HTTP status, duration, worker",
        description="Example: telegram-intake attempts shop 123456",
    )
    attempts.add_argument("bot", type=_bot)
    attempts.add_argument("update_id", type=int)
    attempts.add_argument("--json", action="store_true", help="print JSON")
    attempts.set_defaults(handler=_attempts)
    park = commands.add_parser(
        "park",
        help="end a poison update's current attempt as an exhaustion, freeing its chat",
        description="Example: telegram-intake park shop 123456 --reason 'crashes the handler'",
    )
    park.add_argument("bot", type=_bot)
    park.add_argument("update_id", type=int)
    park.add_argument("--reason", required=True, help="kept as the exhaustion's error")
    park.set_defaults(handler=_park)
    audit = commands.add_parser(
        "audit",
        help="operator actions, newest first: who, what, which, how many",
        description="Example: telegram-intake audit --limit 20",
    )
    audit.add_argument("--after", type=int, help="older than this id (the next page)")
    audit.add_argument("--limit", type=int, default=50, help="rows (default 50)")
    audit.add_argument("--json", action="store_true", help="print JSON")
    audit.set_defaults(handler=_audit)
