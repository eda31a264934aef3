"""`exhaustions redrive` and `exhaustions ack` (docs/contract.md section 9): open exhaustions
delivered again or acknowledged, by filter or by exact identity, a dry run first if wished. Like
every operator command they act on the database the service uses, through the store methods the API
uses, and each action is recorded in the audit log under `cli:USER@HOST`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from app.cli.operations import run_on_store
from app.cli.terminal import (
    actor,
    bot_argument,
    destination_argument,
    known_bot,
    pace_argument,
    print_json,
    vars_of,
    when_argument,
)
from app.config import Settings
from app.store import BulkOutcome, ClaimIdentity, ExhaustionFilter, OperatorStore
from app.store.types import DEFAULT_DESTINATION

SubCommands = Any  # argparse's private _SubParsersAction


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
            identity = ClaimIdentity(bot, int(update_id), int(attempt), claim_id, args.destination)
            return [identity]
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
        destination=args.destination,
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
        print_json(
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
    if not all(known_bot(settings, bot) for bot in named):
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

    return run_on_store(settings, work)


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

    return run_on_store(settings, work)


def _filter_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("identity", nargs="*", help="BOT UPDATE_ID ATTEMPT CLAIM_ID: exactly one")
    parser.add_argument("--bot", type=bot_argument, help="one bot's exhaustions")
    parser.add_argument("--type", help="of this update type (message, callback_query, ...)")
    parser.add_argument(
        "--chat", help="of this queue key (Telegram's queue: a chat's id for its messages)"
    )
    parser.add_argument("--error-contains", help="whose error holds this text")
    parser.add_argument(
        "--destination",
        type=destination_argument,
        default=DEFAULT_DESTINATION,
        help="the exhaustions of deliveries to one destination beside default",
    )
    parser.add_argument(
        "--exhausted-after", type=when_argument, help="exhausted at or after (ISO/ms)"
    )
    parser.add_argument("--exhausted-before", type=when_argument, help="exhausted before (ISO/ms)")
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
        "--rate", type=pace_argument, help="pace at this many updates per second (default: at once)"
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
