"""Commands for operators: exhaustions list and stats read the database the service uses
(INTAKE_DATABASE_URL), so they work whether the service runs or not; send posts updates to a
running intake, as Telegram would. Operator control's commands are `app.cli.control` and
`app.cli.exhaustion_actions`; `run_on_store` runs theirs too."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from app.cli.service import Commands
from app.cli.terminal import age_text, table, time_text
from app.config import Settings
from app.store import OperatorStore, StoreError, open_store, validate
from app.store.types import STATES


async def _with_store(settings: Settings) -> OperatorStore:
    options = settings.store_options() | {"pool_size": 2, "listen_url": None}
    return await open_store(settings.database_url, **options)


def run_on_store(settings: Settings, work: Any) -> int:
    async def go() -> int:
        store = await _with_store(settings)
        try:
            result: int = await work(store)
            return result
        finally:
            await store.close()

    try:
        return asyncio.run(go())
    except StoreError as error:
        print(f"the database: {error}", file=sys.stderr)
        return 2


def _parse_cursor(value: str) -> tuple[str, int]:
    bot, _, number = value.rpartition(":")
    try:
        return validate.bot_name(bot), validate.update_id(int(number))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a cursor bot:update_id") from None


def _exhaustions_list(settings: Settings, args: argparse.Namespace) -> int:
    async def work(store: OperatorStore) -> int:
        rows = []
        after = args.after
        while True:
            page = await store.due_exhaustions(
                limit=args.limit, after=after, bots=[args.bot] if args.bot else None
            )
            rows += page
            after = (page[-1].identity.bot, page[-1].identity.update_id) if page else None
            if not args.all or len(page) < args.limit:
                break
            print(f"... {len(rows)} exhaustions so far", file=sys.stderr, flush=True)
        if not rows:
            print("no open exhaustions")
            return 0
        print(
            table(
                ["BOT", "UPDATE_ID", "ATTEMPT", "CLAIM_ID", "EXHAUSTED_AT (UTC)", "ERROR"],
                [
                    [
                        row.identity.bot,
                        row.identity.update_id,
                        row.identity.attempt,
                        row.identity.claim_id,
                        time_text(row.exhausted_at),
                        (row.error or "")[:60],
                    ]
                    for row in rows
                ],
            )
        )
        if not args.all and len(page) == args.limit and after is not None:
            print(f"more may follow: --after {after[0]}:{after[1]}")
        print(
            "acknowledge one with: telegram-intake exhaustions ack BOT UPDATE_ID ATTEMPT CLAIM_ID"
        )
        return 0

    return run_on_store(settings, work)


def _stats(settings: Settings, args: argparse.Namespace) -> int:
    async def work(store: OperatorStore) -> int:
        now = await store.database_time()
        rows = await store.stats()
        if args.json:
            print(
                json.dumps(
                    {
                        row.bot: {
                            "states": row.states,
                            "oldest_undelivered_age_ms": None
                            if row.oldest_undelivered_at is None
                            else now - row.oldest_undelivered_at,
                            "unacknowledged_exhaustions": row.unacknowledged_exhaustions,
                        }
                        for row in rows
                    },
                    indent=2,
                )
            )
            return 0
        if not rows:
            print("no updates recorded")
            return 0
        head = [
            "BOT",
            *(state.upper() for state in STATES),
            "OPEN EXHAUSTIONS",
            "OLDEST UNDELIVERED",
        ]
        print(
            table(
                head,
                [
                    [
                        row.bot,
                        *(row.states.get(state, 0) for state in STATES),
                        "-"
                        if row.unacknowledged_exhaustions is None
                        else row.unacknowledged_exhaustions,
                        age_text(
                            None
                            if row.oldest_undelivered_at is None
                            else now - row.oldest_undelivered_at
                        ),
                    ]
                    for row in rows
                ],
            )
        )
        return 0

    return run_on_store(settings, work)


def _updates(source: str) -> Iterator[str]:
    """One update per JSON value: a file holding one object, an array of objects, or one
    object per line."""
    text = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8")
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    json.loads(line)
                except json.JSONDecodeError as error:
                    raise ValueError(f"line {number}: not JSON ({error.msg})") from None
                yield line
        return
    for update in whole if isinstance(whole, list) else [whole]:
        yield json.dumps(update)


def _send(settings: Settings, args: argparse.Namespace) -> int:
    bot = settings.bot(args.bot)
    if bot is None:
        print(f"no bot {args.bot!r} is configured", file=sys.stderr)
        return 2
    try:
        updates = list(_updates(args.file))
    except (OSError, ValueError) as error:
        print(f"cannot read {args.file}: {error}", file=sys.stderr)
        return 2
    base = args.url or f"http://{settings.host}:{settings.port}"
    headers = {
        "x-telegram-bot-api-secret-token": bot.secret_token.get_secret_value(),
        "content-type": "application/json",
    }
    failed = 0
    started = time.monotonic()
    with httpx.Client(base_url=base, transport=httpx.HTTPTransport(retries=2)) as client:
        for number, body in enumerate(updates, 1):
            try:
                response = client.post(f"/telegram/{bot.name}", content=body, headers=headers)
            except httpx.HTTPError as error:
                print(f"the intake at {base} could not be reached ({error})", file=sys.stderr)
                return 1
            if response.status_code != 200:
                failed += 1
                print(f"update {number}: {response.status_code} {response.text}", file=sys.stderr)
            elif len(updates) == 1:
                update_id = json.loads(body).get("update_id")
                print(f"update {update_id}: recorded by {base} (200)")
            if len(updates) > 1 and (number % 100 == 0 or number == len(updates)):
                rate = number / max(time.monotonic() - started, 1e-9)
                print(f"sent {number}/{len(updates)} ({rate:.0f}/s)", file=sys.stderr, flush=True)
    return 1 if failed else 0


def add_commands(commands: Commands) -> Any:
    """exhaustions list, stats, send; the `exhaustions` actions, for
    `app.cli.exhaustion_actions` to add redrive and ack to."""
    exhaustions = commands.add_parser(
        "exhaustions",
        help="list open exhaustions; redrive or acknowledge them by filter or identity",
        description="Exhaustions are updates whose delivery ended for good; each stays until "
        "acknowledged. Example: telegram-intake exhaustions list --bot shop",
    )
    actions = exhaustions.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser(
        "list",
        help="open exhaustions in (bot, update_id) order, a page at a time",
        description="Example: telegram-intake exhaustions list --all",
    )
    listing.add_argument("--bot", help="one bot only")
    listing.add_argument("--after", type=_parse_cursor, help="start after bot:update_id")
    listing.add_argument("--limit", type=int, default=50, help="rows per page (default 50)")
    listing.add_argument("--all", action="store_true", help="every page, with progress")
    listing.set_defaults(handler=_exhaustions_list)
    stats = commands.add_parser(
        "stats",
        help="rows by bot and state, open exhaustions, the oldest undelivered update's age",
        description="Example: telegram-intake stats",
    )
    stats.add_argument("--json", action="store_true", help="print JSON")
    stats.set_defaults(handler=_stats)
    send = commands.add_parser(
        "send",
        help="post updates to a running intake, as Telegram would (for trials)",
        description="FILE holds one update, a JSON array of updates, or one per line; - reads "
        'standard input. Example: echo \'{"update_id": 1, "message": {"text": "hi", '
        '"chat": {"id": 1}}}\' | telegram-intake send default -',
    )
    send.add_argument("bot")
    send.add_argument("file", help="a file, or - for standard input")
    send.add_argument("--url", help="the intake (default: http://INTAKE_HOST:INTAKE_PORT)")
    send.set_defaults(handler=_send)
    return actions
