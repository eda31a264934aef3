"""What the kit's framework adapters cost per request, beside each framework's own path.

A bot with one message handler that does nothing (bench/adapter_servers.py), each server in
its own process on uvloop, under wrk (32 connections, one thread) posting one forwarded
update as the service sends it: identity headers, the secret token, Standard Webhooks
signatures over the body and the identity. Rounds interleave the servers, so the machine's
drift falls on all of them alike; the table gives each server's median.

- aiogram: the kit's `IntakeRequestHandler` (verifies the secret token and both signatures,
  runs the handlers, answers after them) against aiogram's own `SimpleRequestHandler` in the
  foreground, which checks the secret token only and also answers after the handlers.
- python-telegram-bot: the kit's `webhook_app` against the by-hand ASGI app a user writes
  without the kit (secret token, `Update.de_json`, `process_update`).

The ratio is what the kit's checks and bookkeeping cost where a handler does nothing; a real
handler's Bot API call (tens of milliseconds) dwarfs it.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Iterable

from bench.child import free_port, process
from bench.intake import ROOT, Load, generate, table
from telegram_intake_kit.forwarded import identity_message, sign
from telegram_intake_kit.wire import Identity

SERVERS = ("aiogram-own", "aiogram-kit", "ptb-own", "ptb-kit")
PAIRS = (("aiogram", "aiogram-own", "aiogram-kit"), ("python-telegram-bot", "ptb-own", "ptb-kit"))
CONNECTIONS = 32
SECRET = "bench-downstream-secret"  # noqa: S105 - bench/adapter_servers.py's
SIGNING_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"  # noqa: S105
TOKEN = "42:TEST"  # noqa: S105


def forwarded_request() -> tuple[str, dict[str, str]]:
    """One update as the service forwards it: its body and headers, signed now."""
    update = {
        "update_id": 7,
        "message": {
            "message_id": 7,
            "date": 1_700_000_000,
            "chat": {"id": 1001, "type": "private", "first_name": "U"},
            "from": {"id": 1001, "is_bot": False, "first_name": "U"},
            "text": "hello",
        },
    }
    body = json.dumps(update)
    identity = Identity(bot="bench", update_id=7, attempt=1, claim_id="c-7")
    now, received_at = int(time.time()), int(time.time() * 1000)
    headers = {
        "Content-Type": "application/json",
        "X-Telegram-Bot-Api-Secret-Token": SECRET,
        "X-Intake-Bot": identity.bot,
        "X-Intake-Update-Id": str(identity.update_id),
        "X-Intake-Attempt": str(identity.attempt),
        "X-Intake-Claim-Id": identity.claim_id,
        "X-Intake-Lease-Expires-At": str(received_at + 60_000),
        "X-Intake-Received-At": str(received_at),
        "webhook-id": identity.key(),
        "webhook-timestamp": str(now),
        "webhook-signature": sign(SIGNING_SECRET, identity.key(), now, body.encode()),
        "X-Intake-Identity-Signature": sign(
            SIGNING_SECRET, identity_message(identity, received_at), now, b""
        ),
    }
    return body, headers


def wrk(port: int, seconds: int) -> Iterable[str]:
    body, headers = forwarded_request()
    pairs = [part for name, value in headers.items() for part in (name, value)]
    return (
        "wrk", "-t1", f"-c{CONNECTIONS}", f"-d{seconds}s", "--timeout", "10s",
        "-s", str(ROOT / "bench" / "adapters.lua"), f"http://127.0.0.1:{port}/",
        "--", body, *pairs,
    )  # fmt: skip


async def measure(kind: str, bot_api: str, seconds: int, warm_up: int) -> Load:
    command = (sys.executable, "-m", "bench.adapter_servers", kind, bot_api)
    async with process(*command, ready="ready ", merge_stderr=False, label=kind) as child:
        port = int(child.line.split()[1])
        await generate(*wrk(port, warm_up), first=0)
        return await generate(*wrk(port, seconds), first=0)


def median(loads: list[Load], value: str) -> float:
    return statistics.median(getattr(load, value) for load in loads)


async def main(*, quick: bool = False) -> str:
    seconds, warm_up, rounds = (1, 1, 1) if quick else (5, 1, 3)
    results: dict[str, list[Load]] = {kind: [] for kind in SERVERS}
    port = free_port()  # the fake Bot API, for python-telegram-bot's getMe at start
    fake = (sys.executable, "-m", "app.cli", "fake-bot-api", "--port", str(port), "--token", TOKEN)
    async with process(*fake, ready="fake Bot API at"):
        for round_ in range(rounds):
            order = SERVERS if round_ % 2 == 0 else tuple(reversed(SERVERS))
            for kind in order:
                load = await measure(kind, f"http://127.0.0.1:{port}", seconds, warm_up)
                results[kind].append(load)
    refused = {kind: sum(load.non2xx + load.socket_errors for load in loads)
               for kind, loads in results.items()}  # fmt: skip
    assert not any(refused.values()), f"requests refused or failed: {refused}"
    rows = []
    for framework, own, kit in PAIRS:
        own_rate, kit_rate = median(results[own], "rate"), median(results[kit], "rate")
        for kind, rate in ((own, own_rate), (kit, kit_rate)):
            rows.append([
                framework, kind, f"{rate:,.0f}", f"{median(results[kind], 'p50_ms'):.1f}",
                f"{median(results[kind], 'p99_ms'):.1f}",
                "1.00" if kind == own else f"{kit_rate / own_rate:.2f}",
            ])  # fmt: skip
    head = ["framework", "server", "requests/s", "p50 ms", "p99 ms", "x own path"]
    lines = [
        f"{rounds} interleaved rounds of {seconds} s after {warm_up} s of warm-up each, "
        f"{CONNECTIONS} connections; medians.",
        "",
        *table(head, rows),
    ]
    return "\n".join(lines)
