"""Operational events to `operations_url` (docs/contract.md section 9; docs/operations.md lists
them).

The store writes each event in the transaction that makes it (the outbox, `_events`). Here the
workers deliver them: each sweep takes the due events under a lease in the database
(`take_events`), so across every process an event is sent once while none dies, and again only
after its lease lapses (at least once; the receiver dedupes by `webhook-id`). Each POST is signed
with Standard Webhooks by `operations_signing_secret`. A 2xx marks it delivered; anything else
makes it due again after `operations_retry_seconds`, doubling up to an hour, the backoff kept
in its row so that a restart does not reset it. With tracing on, each delivery is a span (its
POST within it, `traceparent` sent): of the update's trace for an event about one update
(exhaustion.created; revision 0008 keeps the trace with the event), else a trace of its own.

Beside delivery run the watches that make events no transaction makes: the backlog watch
(backlog.stale), and the getWebhookInfo watch of the bots with a token (telegram.webhook_error,
and what Telegram holds for the metrics).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Sequence

import httpx
from standardwebhooks import Webhook

from app import bot_api, tracing
from app.bot_settings import BotSettings
from app.config import Settings
from app.dispatch.clock import DatabaseClock
from app.dispatch.forward import in_client_span, post, sign, traced_address
from app.dispatch.maintenance import backoff_seconds, delivered, pause_for, repeat_forever
from app.metrics import Metrics
from app.policy import Outcome
from app.store import OperationalEvent, OperatorStore, StoreError, WebhookInfo
from app.store.storage import failure_level

log = logging.getLogger(__name__)

CONCURRENCY = 16  # deliveries at once, and the events one take leases
SWEEP_SECONDS = 1.0  # how often a worker looks for due events (other processes write them)
TIMEOUT_SECONDS = 10.0  # one delivery's request
LEASE_MARGIN_SECONDS = 20.0
BACKLOG_CHECK_SECONDS = 5.0


class EventDelivery:
    """Delivers the outbox's due events to `operations_url`."""

    def __init__(
        self,
        store: OperatorStore,
        clock: DatabaseClock,
        settings: Settings,
        transport: httpx.AsyncBaseTransport,
        metrics: Metrics,
    ) -> None:
        if settings.operations_url is None or settings.operations_signing_secret is None:
            raise ValueError("operational events need operations_url and its signing secret")
        self._store = store
        self._clock = clock
        self._url = httpx.URL(str(settings.operations_url))
        self._address = traced_address(self._url)
        self._tracer = tracing.tracer()
        self._signer = Webhook(settings.operations_signing_secret.get_secret_value())
        self._transport = transport
        self._retry = settings.operations_retry_seconds
        self._metrics = metrics
        self._timeout = httpx.Timeout(TIMEOUT_SECONDS).as_dict()
        self._lease_ms = int((TIMEOUT_SECONDS + LEASE_MARGIN_SECONDS) * 1000)

    async def run(self) -> None:
        async def wait(took: float) -> None:
            await asyncio.sleep(max(0.0, SWEEP_SECONDS - took))

        await repeat_forever("operational event delivery", self.sweep, wait)

    async def sweep(self) -> int:
        """Deliver every event due now, CONCURRENCY at a time, each under its lease; how many
        the receiver took."""
        delivered = 0
        while True:
            now = self._clock.now()
            taken = await self._store.take_events(
                now=now, lease_until=now + self._lease_ms, limit=CONCURRENCY
            )
            results = await asyncio.gather(*(self._deliver(e) for e in taken))
            delivered += sum(results)
            if len(taken) < CONCURRENCY:
                return delivered

    async def _deliver(self, event: OperationalEvent) -> bool:
        """Deliver one event; with tracing on, in a span "deliver {type}": of the update's
        trace for an event about one (exhaustion.created), else a trace of its own."""

        def send(traceparent: str | None) -> Awaitable[Outcome]:
            headers = {"content-type": "application/json", "accept-encoding": "identity"}
            if traceparent is not None:
                headers["traceparent"] = traceparent
            now = self._clock.now
            sign(self._signer, headers, event.message_id, event.payload, now())
            return post(self._transport, self._url, headers, event.payload, self._timeout, now=now)

        attributes = {
            "intake.event.type": event.type,
            "intake.event.id": event.message_id,
            "intake.deliveries": event.deliveries,  # the failed ones before this
        }
        name = f"deliver {event.type}"
        with tracing.span_of(self._tracer, name, event.trace_context, attributes) as span:
            outcome = await in_client_span(self._tracer, self._address, send)
            delivered(span, outcome)
            if outcome.taken:
                self._metrics.operational_event(event.type, "delivered")
                return await tracing.recorded(
                    self._tracer,
                    "mark delivered",
                    lambda: self._store.event_delivered(event, self._clock.now()),
                )
            self._metrics.operational_event(event.type, "failed")
            pause = backoff_seconds(self._retry, event.deliveries)
            await self._store.event_failed(event, self._clock.now() + int(pause * 1000))
            log.warning(
                "operational event %s (%s) not delivered (%s); next try in %.0f s",
                event.message_id,
                event.type,
                outcome.error,
                pause,
            )
            return False


async def watch_backlog_forever(
    store: OperatorStore, clock: DatabaseClock, bots: Sequence[str], *, stale_after_seconds: float
) -> None:
    """backlog.stale for each of `bots` whose oldest undelivered update is older than
    `stale_after_seconds`: once an episode, across every process (the store's rule)."""
    stale_after_ms = int(stale_after_seconds * 1000)
    interval = min(BACKLOG_CHECK_SECONDS, stale_after_seconds / 2)

    async def check() -> None:
        began = await store.watch_backlog(bots, now=clock.now(), stale_after_ms=stale_after_ms)
        for bot in began:
            log.warning(
                "bot %r: the oldest undelivered update is over %g s old (backlog.stale)",
                bot,
                stale_after_seconds,
            )

    await repeat_forever("backlog watch", check, pause_for(interval))


class WebhookWatch:
    """getWebhookInfo for each bot with a token, once per `webhook_check_seconds` across the
    cluster (the check is leased in the database): what Telegram holds and its last error are
    kept for every process's metrics, and a new error is a telegram.webhook_error event."""

    def __init__(
        self,
        store: OperatorStore,
        clock: DatabaseClock,
        settings: Settings,
        bots: Sequence[BotSettings],
        metrics: Metrics,
    ) -> None:
        self._store = store
        self._clock = clock
        self._settings = settings
        self._bots = [bot for bot in bots if bot.bot_token is not None]
        self._interval_ms = int(settings.webhook_check_seconds * 1000)
        self._metrics = metrics

    @property
    def bots(self) -> list[str]:
        return [bot.name for bot in self._bots]

    async def run(self) -> None:
        tick = min(1.0, self._interval_ms / 4000)
        async with bot_api.async_client() as client:
            while True:
                for bot in self._bots:
                    try:
                        await self.check(client, bot)
                    except StoreError as error:
                        level = failure_level(error)
                        log.log(level, "webhook watch of bot %r: %s", bot.name, error)
                    except Exception:  # a bug must not end the watch for the process's life
                        log.exception("webhook watch of bot %r failed", bot.name)
                await asyncio.sleep(tick)

    async def check(self, client: httpx.AsyncClient, bot: BotSettings) -> bool | None:
        """Check `bot` if its check is due and no other process took it: whether Telegram
        reported a new error (None: not due, or Telegram could not say)."""
        now = self._clock.now()
        if not await self._store.take_webhook_check(
            bot.name, now=now, next_at=now + self._interval_ms
        ):
            return None
        try:
            answer = await bot_api.call_async(client, self._settings, bot, "getWebhookInfo")
        except bot_api.BotApiError as error:
            self._metrics.webhook_check(bot.name, "failed")
            log.warning("webhook watch of bot %r: %s", bot.name, error)
            return None
        self._metrics.webhook_check(bot.name, "checked")
        info = webhook_info(answer)
        new = await self._store.report_webhook_info(bot.name, info, at=self._clock.now())
        if new:
            log.warning(
                "bot %r: Telegram reports a webhook error: %s (%d updates pending)",
                bot.name,
                info.last_error_message,
                info.pending_update_count,
            )
        return new


def webhook_info(answer: object) -> WebhookInfo:
    """getWebhookInfo's result, as far as the watch reads it (missing fields are zero)."""
    fields = answer if isinstance(answer, dict) else {}
    error_date = fields.get("last_error_date")
    message = fields.get("last_error_message")
    pending = fields.get("pending_update_count")
    return WebhookInfo(
        url=str(fields.get("url") or ""),
        pending_update_count=pending if isinstance(pending, int) and pending >= 0 else 0,
        last_error_date=error_date if isinstance(error_date, int) and error_date > 0 else None,
        last_error_message=str(message)[:500] if message is not None else None,
    )
