"""Commands for personal data (docs/privacy.md): `keys status`, `erase` and `forget-bot`. They
read and write the database the service uses, with the service's key ring, whether the service
runs or not: an erasure this command requests is worked by the workers, or by this command
itself while it waits, whichever takes it first."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict

from app.cli.operations import run_on_store
from app.cli.service import Commands
from app.cli.terminal import actor, bot_argument, telegram_id_argument
from app.config import Settings
from app.dispatch.privacy import worked_until_done
from app.store import OperatorStore
from app.store.operator_types import Erasure, ErasureKind


def _keys_status(settings: Settings, args: argparse.Namespace) -> int:
    async def work(store: OperatorStore) -> int:
        counts = await store.count_keys(at=time.time_ns() // 1_000_000)
        if args.json:
            print(json.dumps(counts, sort_keys=True))
            return 0
        current = settings.key_ring.current if settings.key_ring is not None else None
        for key_id, stored in sorted(counts.items()):
            note = " (encrypts)" if key_id == current else ""
            if key_id != "none" and stored == 0 and key_id != current:
                note = " (nothing left: may leave the ring)"
            print(f"{key_id:<34} {stored:>12}{note}")
        return 0

    return run_on_store(settings, work)


async def _erase(
    store: OperatorStore, bot: str, kind: ErasureKind, subject: int | None, args: argparse.Namespace
) -> int:
    host_ms = time.time_ns() // 1_000_000
    skew = await store.database_time() - host_ms  # leases are on the database's clock

    def now() -> int:
        return time.time_ns() // 1_000_000 + skew

    erasure_id = await store.request_erasure(
        bot, kind=kind, subject=subject, at=now(), by=actor(), dry_run=args.dry_run
    )
    if args.no_wait:
        done = await store.get_erasure(erasure_id)
    else:
        done = await worked_until_done(store, erasure_id, now)
    assert done is not None
    _report(done, args.json)
    return 0


def _report(done: Erasure, as_json: bool) -> None:
    if as_json:
        print(json.dumps(asdict(done), sort_keys=True))
        return
    if done.state != "done":
        print(f"erasure {done.id} requested ({done.state}): `telegram-intake` workers finish it")
        return
    verb = "would erase" if done.dry_run else "erased"
    print(
        f"erasure {done.id}: {verb} {done.updates} updates, {done.attempts} attempts and "
        f"{done.events} events of bot {done.bot!r}"
    )


def _erase_command(settings: Settings, args: argparse.Namespace) -> int:
    kind: ErasureKind = "user" if args.user is not None else "chat"
    subject = args.user if args.user is not None else args.chat
    return run_on_store(settings, lambda store: _erase(store, args.bot, kind, subject, args))


def _forget_bot(settings: Settings, args: argparse.Namespace) -> int:
    if not args.yes and not args.dry_run:
        print(
            f"forget-bot erases everything bot {args.bot!r} stored, for good: "
            "add --yes (or try --dry-run)",
            file=sys.stderr,
        )
        return 2
    return run_on_store(settings, lambda store: _erase(store, args.bot, "bot", None, args))


def _waiting(command: argparse.ArgumentParser) -> None:
    command.add_argument("--dry-run", action="store_true", help="count only, erase nothing")
    command.add_argument("--json", action="store_true", help="print the job as JSON")
    command.add_argument(
        "--no-wait", action="store_true", help="request it and return; the workers finish it"
    )


def add_commands(commands: Commands) -> None:
    """keys status, erase, forget-bot."""
    keys = commands.add_parser(
        "keys",
        help="the encryption key ring: how many stored values each key holds",
        description="Example: telegram-intake keys status --json",
    )
    actions = keys.add_subparsers(dest="action", required=True, metavar="ACTION")
    status = actions.add_parser(
        "status",
        help="stored values by the key id they are sealed under ('none': stored as they are); "
        "a key at 0 may leave INTAKE_ENCRYPTION_KEYS",
        description="Counts every table (one scan each). Example: telegram-intake keys status",
    )
    status.add_argument("--json", action="store_true", help="one JSON object: key id -> count")
    status.set_defaults(handler=_keys_status)
    erase = commands.add_parser(
        "erase",
        help="erase every stored copy of a user's or a chat's updates, with their history and "
        "events (a user's request under the Bot Developer Terms, 4.2)",
        description="Erases every update of BOT naming the id in any role (sender, chat, "
        "member, contact, forward origin, reply, ...). Waits for the end unless --no-wait. "
        "Example: telegram-intake erase shop --user 123456789 --dry-run",
    )
    erase.add_argument("bot", type=bot_argument)
    subject = erase.add_mutually_exclusive_group(required=True)
    subject.add_argument("--user", type=telegram_id_argument, help="a user's id")
    subject.add_argument("--chat", type=telegram_id_argument, help="a chat's id")
    _waiting(erase)
    erase.set_defaults(handler=_erase_command)
    forget = commands.add_parser(
        "forget-bot",
        help="erase everything a bot stored (a bot that stops: the Terms, 4.2)",
        description="Example: telegram-intake forget-bot oldbot --yes",
    )
    forget.add_argument("bot", type=bot_argument)
    forget.add_argument("--yes", action="store_true", help="yes, erase it all for good")
    _waiting(forget)
    forget.set_defaults(handler=_forget_bot)
