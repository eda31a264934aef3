"""What every test bot does with a message, whatever its framework (the TypeScript bots in
kit/typescript/test/bots do the same): the end-to-end tests tell the frameworks apart only by
the bot they start.

Configured by the environment: BOT_TOKEN, BOT_API_ROOT (the fake Bot API), PORT,
SECRET_TOKEN and SIGNING_SECRET (either or both), INTAKE_URL and API_KEY (the callback API,
optional), DEFER_AFTER (seconds).

A message's text says what its handler does: `fail-once` raises on the update's first
attempt (on every one, given no attempt); `terminal` raises `Terminal`; `sleep:<ms>` sleeps
that long first. Then the handler sends one message to the chat, a JSON object: the
update_id, the text, and the attempt it was given (with `owns()` asked of the service when
the callback API is configured). With OTEL_EXPORTER_OTLP_ENDPOINT (the Python bots only), the
handler traces its work as a span "handle message", exported by the bot's own SDK.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable
from typing import Any

from telegram_intake_kit import IntakeAttempt, Terminal

TOKEN = os.environ.get("BOT_TOKEN", "123456:AAH-secret-bot-token")
API_ROOT = os.environ.get("BOT_API_ROOT", "http://127.0.0.1:8081")
PORT = int(os.environ.get("PORT", "8443"))


def options() -> dict[str, Any]:
    """The adapter's keyword arguments, from the environment."""
    return {
        "secret_token": os.environ.get("SECRET_TOKEN") or None,
        "signing_secret": os.environ.get("SIGNING_SECRET") or None,
        "intake_url": os.environ.get("INTAKE_URL") or None,
        "api_key": os.environ.get("API_KEY") or None,
        "defer_after": float(os.environ.get("DEFER_AFTER", "10")),
    }


def _tracer() -> Any:
    """With OTEL_EXPORTER_OTLP_ENDPOINT set, the bot traces as any service would: OpenTelemetry's
    SDK with a provider of its own, exporting over OTLP (OTEL_SERVICE_NAME names it). None
    otherwise. The adapters know nothing of it: they continue the forward's trace through
    OpenTelemetry's API alone."""
    if not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return None
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    return provider.get_tracer("test bot")


TRACER = _tracer()


async def behave(
    update_id: int, text: str, attempt: IntakeAttempt | None, send: Callable[[str], Awaitable[Any]]
) -> None:
    """What the handler does (the module's rule); in a span of its own when the bot traces."""
    if TRACER is None:
        await _behave(update_id, text, attempt, send)
        return
    with TRACER.start_as_current_span("handle message", attributes={"bot.update_id": update_id}):
        await _behave(update_id, text, attempt, send)


async def _behave(
    update_id: int, text: str, attempt: IntakeAttempt | None, send: Callable[[str], Awaitable[Any]]
) -> None:
    if text == "fail-once" and (attempt is None or attempt.identity.attempt == 1):
        raise RuntimeError("fail-once")
    if text == "terminal":
        raise Terminal("terminal")
    if text.startswith("sleep:"):
        await asyncio.sleep(int(text.removeprefix("sleep:")) / 1000)
    seen = None
    if attempt is not None:
        seen = {
            "bot": attempt.identity.bot,
            "update_id": attempt.identity.update_id,
            "attempt": attempt.identity.attempt,
            "claim_id": attempt.identity.claim_id,
            "owns": await attempt.owns() if attempt.client is not None else None,
        }
    await send(json.dumps({"update_id": update_id, "text": text, "intake": seen}))
