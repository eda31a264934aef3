"""Commands that talk to the Bot API (`app.bot_api`): set-webhook, delete-webhook, webhook-info,
and fake-bot-api, a fake of it for trials. The bot token is never printed.

set-webhook checks what it sends as Telegram's Bot API server would, before it sends anything
(`app.cli.webhook_checks`): a refusal is exit code 2 with no request made."""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from app.bot_api import BotApiError, call
from app.bot_settings import BotSettings
from app.cli.service import Commands
from app.cli.webhook_checks import (
    ip_address_problems,
    opt_in_notice,
    read_certificate,
    url_problems,
)
from app.config import Settings
from app.destinations.routing import needed_updates, unreachable
from app.fake_bot_api import TOKEN as FAKE_TOKEN
from app.queues import OPT_IN
from app.webhook_rules import (
    MAX_CONNECTIONS_LOCAL,
    MAX_CONNECTIONS_OFFICIAL,
    OFFICIAL_BOT_API_URL,
    is_local_bot_api,
    max_connections_problem,
    update_types_problem,
)


def describe_webhook(bot: str, info: dict[str, Any], now: float | None = None) -> str:
    """getWebhookInfo in plain words."""
    now = time.time() if now is None else now
    url = info.get("url") or ""
    lines = [f"bot {bot}: " + (f"webhook {url}" if url else "no webhook set (getUpdates mode)")]
    lines.append(f"  pending updates: {info.get('pending_update_count', 0)}")
    error_date = info.get("last_error_date")
    if error_date:
        when = datetime.fromtimestamp(error_date, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        lines.append(
            f"  last error: {when} ({_ago(now - error_date)}): "
            f"{info.get('last_error_message', 'no message')}"
        )
    else:
        lines.append("  last error: none")
    sync_error = info.get("last_synchronization_error_date")
    if sync_error:
        lines.append(f"  last synchronisation error: {_ago(now - sync_error)}")
    if info.get("max_connections"):
        lines.append(f"  max connections: {info['max_connections']}")
    allowed = info.get("allowed_updates")
    lines.append("  allowed updates: " + (", ".join(allowed) if allowed else "all but the opt-in"))
    # Telegram's own words for an address it has not resolved yet: "<unknown>".
    if info.get("ip_address") and info["ip_address"] != "<unknown>":
        lines.append(f"  delivers to IP address {info['ip_address']}")
    if info.get("has_custom_certificate"):
        lines.append("  trusts the certificate uploaded with setWebhook")
    return "\n".join(lines)


def _ago(seconds: float) -> str:
    for unit, size in (("day", 86_400), ("hour", 3_600), ("minute", 60)):
        if seconds >= size:
            count = int(seconds // size)
            return f"{count} {unit}{'s' if count != 1 else ''} ago"
    return f"{max(int(seconds), 0)} seconds ago"


def _bot(settings: Settings, name: str) -> BotSettings | None:
    bot = settings.bot(name)
    if bot is None:
        configured = ", ".join(b.name for b in settings.bots) or "none"
        print(f"no bot {name!r} is configured (configured: {configured})", file=sys.stderr)
    return bot


def _set_webhook(settings: Settings, args: argparse.Namespace) -> int:
    bot = _bot(settings, args.bot)
    if bot is None:
        return 2
    local = is_local_bot_api(settings.bot_api_url)
    allowed = bot.allowed_updates
    problems: list[str] = []
    if args.allowed_updates is not None:
        allowed = tuple(name.strip() for name in args.allowed_updates.split(",") if name.strip())
        if not allowed:
            problems.append(
                "--allowed-updates names no update type: name the types to receive "
                "(comma-separated), or leave the option out to send the bot's allowed_updates "
                "setting; with neither, Telegram keeps the list it has (at first its default: "
                f"every type but {', '.join(OPT_IN)})"
            )
    if allowed:
        source = "--allowed-updates" if args.allowed_updates is not None else "allowed_updates"
        problem = update_types_problem(allowed)
        if problem is not None:
            problems.append(f"{source}: {problem}")
        problems += [f"{source}: {problem}" for problem in unreachable(bot.targets, allowed)]
    elif allowed is None:  # what the destinations' filters need (None: Telegram's default)
        allowed = needed_updates(bot.targets)
    connections = bot.max_connections
    if args.max_connections is not None:
        connections = args.max_connections
        problem = max_connections_problem(connections, local)
        if problem is not None:
            problems.append(f"--max-connections {problem}")
    problems += url_problems(args.url, local)
    if args.ip_address is not None:
        problems += ip_address_problems(args.ip_address, local)
    files = None
    if args.certificate is not None:
        certificate, problem = read_certificate(args.certificate)
        if problem is not None:
            problems.append(problem)
        files = {"certificate": (Path(args.certificate).name, certificate)}
    if problems:
        for problem in problems:
            print(f"set-webhook refused, nothing sent: {problem}", file=sys.stderr)
        return 2
    info = _change_webhook(
        settings,
        bot,
        "setWebhook",
        args.url,
        files=files,
        url=args.url,
        secret_token=bot.secret_token.get_secret_value(),
        allowed_updates=None if allowed is None else list(allowed),
        max_connections=connections,
        ip_address=args.ip_address,
        drop_pending_updates=True if args.drop_pending_updates else None,
    )
    if info is None:
        return 1
    notice = opt_in_notice(info.get("allowed_updates"))
    if notice:
        print(notice, file=sys.stderr)
    return 0


def _change_webhook(
    settings: Settings,
    bot: BotSettings,
    method: str,
    wanted: str,
    files: dict[str, tuple[str, bytes]] | None = None,
    **params: Any,
) -> dict[str, Any] | None:
    """Call `method`, then confirm with getWebhookInfo that the webhook is `wanted` ("":
    none); say what Telegram now knows. getWebhookInfo's answer, or None: it failed (said)."""
    try:
        call(settings, bot, method, files=files, **params)
        info: dict[str, Any] = call(settings, bot, "getWebhookInfo")
    except BotApiError as error:
        print(error, file=sys.stderr)
        return None
    if (info.get("url") or "") != wanted:
        shown = info.get("url")
        print(f"{method} answered ok, but getWebhookInfo shows {shown!r}", file=sys.stderr)
        return None
    print(describe_webhook(bot.name, info))
    return info


def _webhook_info(settings: Settings, args: argparse.Namespace) -> int:
    bot = _bot(settings, args.bot)
    if bot is None:
        return 2
    try:
        info = call(settings, bot, "getWebhookInfo")
    except BotApiError as error:
        print(error, file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(info, indent=2, sort_keys=True))
    else:
        print(describe_webhook(bot.name, info))
    return 0


def _delete_webhook(settings: Settings, args: argparse.Namespace) -> int:
    bot = _bot(settings, args.bot)
    if bot is None:
        return 2
    drop = True if args.drop_pending_updates else None
    info = _change_webhook(settings, bot, "deleteWebhook", "", drop_pending_updates=drop)
    return 1 if info is None else 0


def _fake_bot_api(_settings: Settings, args: argparse.Namespace) -> int:
    import uvicorn

    from app.fake_bot_api import FakeBotApi

    fake = FakeBotApi(args.token)
    # Listening before the hints are printed: a client that follows them at once connects.
    listening = socket.create_server((args.host, args.port))
    base = f"http://{args.host}:{listening.getsockname()[1]}"
    update = '[{"update_id": 1, "message": {"message_id": 1, "date": 0, '
    update += '"chat": {"id": 42, "type": "private"}, "text": "hello"}}]'
    print(
        f"fake Bot API at {base}, bot token {args.token}",
        f"fake: poll it  INTAKE_BOT_API_URL={base} INTAKE_BOT_TOKEN={args.token} "
        "telegram-intake run --demo --poll",
        f"fake: hand it updates  curl -s -d '{update}' {base}/fake/updates",
        sep="\n",
        flush=True,
    )
    server = uvicorn.Server(uvicorn.Config(fake.app(), log_level="warning"))
    server.run(sockets=[listening])
    return 0


def add_commands(commands: Commands) -> None:
    """set-webhook, delete-webhook, webhook-info, fake-bot-api."""
    command = commands.add_parser(
        "set-webhook",
        help="point Telegram at this service: setWebhook with the bot's secret token, then "
        "confirm with getWebhookInfo",
        description="Call setWebhook with the bot's secret_token, allowed_updates and "
        "max_connections, then show getWebhookInfo. Everything is checked first as Telegram "
        "would, and nothing is sent on a refusal (exit code 2): Telegram's own server needs "
        "https:// on port 443, 80, 88 or 8443, max_connections 1-100 and an IPv4 ip_address "
        "that is not reserved; a local Bot API server (a bot_api_url other than "
        f"{OFFICIAL_BOT_API_URL}) takes http://, any port, 1-{MAX_CONNECTIONS_LOCAL} and any "
        "address. Example: telegram-intake set-webhook shop "
        "--url https://intake.example.com/telegram/shop",
    )
    command.add_argument("bot", help="a configured bot's name")
    command.add_argument("--url", required=True, help="the public HTTPS URL of /telegram/BOT")
    command.add_argument(
        "--allowed-updates",
        help="comma-separated update types (default: the bot's allowed_updates; with none, "
        "Telegram keeps the list it has); "
        f"{', '.join(OPT_IN)} come only when named",
    )
    command.add_argument(
        "--max-connections",
        type=int,
        metavar="N",
        help=f"Telegram's connections at once: 1-{MAX_CONNECTIONS_OFFICIAL}, "
        f"1-{MAX_CONNECTIONS_LOCAL} with a local Bot API server (default: the bot's setting)",
    )
    command.add_argument(
        "--certificate",
        metavar="FILE",
        help="a self-signed certificate's public key (PEM, at most 3 MiB) for Telegram to "
        "trust, uploaded with the call",
    )
    command.add_argument(
        "--ip-address",
        metavar="IP",
        help="the address Telegram delivers to instead of resolving the URL's host (IPv4, "
        "not reserved; any with a local Bot API server)",
    )
    command.add_argument(
        "--drop-pending-updates", action="store_true", help="discard what Telegram holds"
    )
    command.set_defaults(handler=_set_webhook)
    command = commands.add_parser(
        "delete-webhook",
        help="stop Telegram's webhook, so that the bot's updates can be polled (getUpdates)",
        description="Call deleteWebhook, then show getWebhookInfo. Updates Telegram holds stay "
        "for getUpdates unless --drop-pending-updates. Switch a bot to polling with this, then "
        'source = "polling"; back with set-webhook. '
        "Example: telegram-intake delete-webhook shop",
    )
    command.add_argument("bot", help="a configured bot's name")
    command.add_argument(
        "--drop-pending-updates", action="store_true", help="discard what Telegram holds"
    )
    command.set_defaults(handler=_delete_webhook)
    command = commands.add_parser(
        "webhook-info",
        help="show what Telegram knows of the bot's webhook: URL, pending updates, last error",
        description="Call getWebhookInfo and say it in plain words. "
        "Example: telegram-intake webhook-info shop",
    )
    command.add_argument("bot", help="a configured bot's name")
    command.add_argument("--json", action="store_true", help="print Telegram's answer as JSON")
    command.set_defaults(handler=_webhook_info)
    command = commands.add_parser(
        "fake-bot-api",
        help="a fake of Telegram's Bot API for trials: run --poll against it, hand it updates",
        description="Serve a fake Bot API (getUpdates, setWebhook, deleteWebhook, "
        "getWebhookInfo, as Telegram documents them) and POST /fake/updates to give it "
        "updates. Example: telegram-intake fake-bot-api --port 8081",
    )
    command.add_argument("--host", default="127.0.0.1", help="address to listen on")
    command.add_argument("--port", type=int, default=8081, help="port to listen on")
    command.add_argument("--token", default=FAKE_TOKEN, help="the bot token it accepts")
    command.set_defaults(handler=_fake_bot_api)
