"""Operator control of updates from the command line (docs/contract.md section 9): updates,
attempts, park, audit; bots, pause, resume, rate-limit and replay are `app.cli.bot_control`,
`exhaustions redrive|ack` by filter `app.cli.exhaustion_actions`.

Like the other operator commands they work on the database the service uses, whether the
service runs or not, through the same store methods as the API: a pause binds every worker
process at its commit, and every action is recorded in the audit log, under `cli:USER@HOST`.
`--json` prints what a script would read.
"""

from __future__ import annotations

import argparse
import json
import sys

from app.cli.bot_control import destination_option, named
from app.cli.operations import run_on_store
from app.cli.service import Commands
from app.cli.terminal import (
    actor,
    bot_argument,
    destination_argument,
    known_bot,
    print_json,
    table,
    telegram_id_argument,
    time_text,
    vars_of,
    when_argument,
)
from app.config import Settings
from app.store import ClaimIdentity, OperatorStore, StoredDelivery, StoredUpdate, UpdateFilter
from app.store.types import DEFAULT_DESTINATION, STATES

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
                f"update {args.update_id} of {named(args)!r} has no attempt to park ({state})",
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
    """updates, attempts, park, audit."""
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
    destination_option(attempts)
    attempts.set_defaults(handler=_attempts)
    park = commands.add_parser(
        "park",
        help="end a poison update's current attempt as an exhaustion, freeing its chat",
        description="Example: telegram-intake park shop 123456 --reason 'crashes the handler'",
    )
    park.add_argument("bot", type=bot_argument)
    park.add_argument("update_id", type=int)
    park.add_argument("--reason", required=True, help="kept as the exhaustion's error")
    destination_option(park)
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
