"""Long polling (docs/contract.md section 11): getUpdates as a source, recording before it confirms.

For each bot with `source = "polling"`, one process of the cluster polls: it holds the bot's
poller lease in the database (`take_poller`), renewed every LEASE_SECONDS / 3 while a long
poll is open, and a process whose holder died takes over once the lease lapses (a few
seconds). Each batch is recorded through the store's add path (update type and queue key as
the webhook's, duplicates changing nothing) together with the next offset, in one transaction
under the lease (`record_polled`); only then does the next getUpdates ask for that offset,
which is what confirms the batch to Telegram. A crash between the two fetches the batch
again, and its keys change nothing.

Telegram's answers: 409 (a webhook is set, or another getUpdates runs elsewhere) is logged
naming the cause, counted, and tried again after a backoff; 429 waits its `retry_after`; 5xx
and network errors back off; 401 (a token Telegram refuses) stops this bot's poller and says
so, naming the bot, never the token.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import socket
from collections.abc import Callable
from typing import Any

import httpx

from app import bot_api
from app.bot_settings import BotSettings
from app.config import Settings
from app.destinations.routing import Router
from app.intake.updates import classify
from app.metrics import Metrics
from app.privacy.subjects import subjects_of
from app.store import NewUpdate, StoreError, validate
from app.store.polling.roles import Polling

log = logging.getLogger(__name__)

LEASE_SECONDS = 6.0  # a dead poller's bot is polled again within this
BACKOFF_SECONDS = 1.0  # the first pause after a failure, doubling
MAX_BACKOFF_SECONDS = 30.0
MARGIN_SECONDS = 10.0  # a long poll's answer may come this much after its timeout


class LeaseLost(Exception):
    """Another process took the poller's lease: stop before confirming anything."""


class Poller:
    """getUpdates for one bot, while this process holds its lease."""

    def __init__(
        self,
        store: Polling,
        now: Callable[[], int],
        settings: Settings,
        bot: BotSettings,
        metrics: Metrics,
        *,
        on_added: Callable[[], None] | None = None,
        lease_seconds: float = LEASE_SECONDS,
    ) -> None:
        self._store = store
        self._now = now  # the database's clock, as every lease is judged
        self._settings = settings
        self.bot = bot
        self._router = Router(bot.targets)
        self._meters = metrics.polling(bot.name)
        self._on_added = on_added
        self._lease_ms = int(lease_seconds * 1000)
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.stopped: str | None = None  # why this bot's poller stopped for good (401)

    async def run(self) -> None:
        try:
            await self._poll_until_stopped()
        finally:
            await self._release()
        # Stopped for good (Telegram refuses the token): /readyz says why, and the task stays,
        # so that /healthz does not take it for a loop that died.
        await asyncio.Event().wait()

    async def _poll_until_stopped(self) -> None:
        failures = 0
        async with bot_api.async_client() as client:
            while self.stopped is None:
                try:
                    offset = await self._take()
                    if offset is None:  # another process polls: stand by
                        log.debug("bot %r: another process polls; standing by", self.bot.name)
                        await asyncio.sleep(self._lease_ms / 3000)
                        continue
                    log.debug("bot %r: getUpdates from offset %d", self.bot.name, offset)
                    await self._poll(client, offset)
                    failures = 0
                except bot_api.BotApiError as error:
                    failures += 1
                    await asyncio.sleep(self._after(error, failures))
                except LeaseLost:
                    log.warning("bot %r: another process took over its getUpdates", self.bot.name)
                except StoreError as error:
                    failures += 1
                    log.warning("bot %r: polling: %s", self.bot.name, error)
                    await asyncio.sleep(_backoff(failures))

    async def _take(self) -> int | None:
        now = self._now()
        return await self._store.take_poller(
            self.bot.name, holder=self.holder, now=now, lease_until=now + self._lease_ms
        )

    async def _poll(self, client: httpx.AsyncClient, offset: int) -> None:
        """One getUpdates under the lease (renewed while it is open), its batch recorded."""
        bot = self.bot
        params: dict[str, Any] = {
            "offset": offset or None,
            "timeout": bot.poll_timeout_seconds,
            "limit": bot.poll_limit,
            "allowed_updates": None if bot.allowed_updates is None else list(bot.allowed_updates),
        }
        self._meters.offset.set(offset)
        keeper = asyncio.create_task(self._keep_lease())
        request = asyncio.create_task(
            bot_api.call_async(
                client,
                self._settings,
                bot,
                "getUpdates",
                wait=bot.poll_timeout_seconds + MARGIN_SECONDS,
                **params,
            )
        )
        try:
            done, _ = await asyncio.wait({keeper, request}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            keeper.cancel()
        if request not in done:
            request.cancel()
            await asyncio.gather(request, return_exceptions=True)
            keeper.result()  # LeaseLost, or the store's error
        answer = request.result()
        self._meters.requests["ok"].inc()
        rows = self._rows(answer)
        if not rows:
            return
        self._meters.updates.inc(len(rows))
        following = max(row.update_id for row in rows) + 1
        added = await self._store.record_polled(
            bot.name, rows, holder=self.holder, now=self._now(), offset=following
        )
        if added is None:
            raise LeaseLost
        self._meters.offset.set(following)
        if added and self._on_added is not None:
            self._on_added()

    async def _keep_lease(self) -> None:
        while True:
            await asyncio.sleep(self._lease_ms / 3000)
            if await self._take() is None:
                raise LeaseLost

    def _rows(self, answer: Any) -> list[NewUpdate]:
        """The batch as rows, received now; an entry that is not an update is logged and left
        out (Telegram's own answers never hold one)."""
        if not isinstance(answer, list):
            raise bot_api.BotApiError("getUpdates: the result is not a list of updates")
        now = self._now()
        rows = []
        for update in answer:
            try:
                update_id = validate.update_id(update.get("update_id"))
            except (ValueError, AttributeError):
                log.warning("bot %r: getUpdates returned a non-update; left out", self.bot.name)
                continue
            update_type, queue_key = classify(update)
            body = json.dumps(update, ensure_ascii=False, separators=(",", ":"))
            rows.append(
                NewUpdate(
                    self.bot.name,
                    update_id,
                    body,
                    now,
                    update_type,
                    queue_key,
                    subjects=subjects_of(update),
                    routes=self._router.routes(update_type, update),
                )
            )
        return rows

    def _after(self, error: bot_api.BotApiError, failures: int) -> float:
        """The pause after a refused or failed getUpdates, counted and logged by its cause."""
        name = self.bot.name
        self._meters.last_error.set_to_current_time()
        if error.code == 409:
            self._meters.requests["conflict"].inc()
            log.warning(
                "bot %r: getUpdates refused with 409 Conflict: a webhook is set (run "
                "`telegram-intake delete-webhook %s`) or another getUpdates runs elsewhere: %s",
                name,
                name,
                error,
            )
        elif error.code == 429:
            self._meters.requests["rate_limited"].inc()
            wait = error.retry_after if error.retry_after is not None else _backoff(failures)
            log.warning("bot %r: getUpdates rate-limited; waiting %.0f s", name, wait)
            return wait
        elif error.code in (401, 404):
            self._meters.requests["unauthorized"].inc()
            self.stopped = f"Telegram refuses bot {name!r}'s token ({error})"
            log.error("bot %r: polling stopped: Telegram refuses its token: %s", name, error)
            return 0.0
        else:
            self._meters.requests["failed"].inc()
            log.warning("bot %r: getUpdates failed: %s", name, error)
        return _backoff(failures)

    async def _release(self) -> None:
        try:
            await self._store.release_poller(self.bot.name, holder=self.holder)
        except StoreError as error:
            log.warning("bot %r: could not release its poller: %s", self.bot.name, error)


def _backoff(failures: int) -> float:
    return float(min(BACKOFF_SECONDS * 2 ** min(failures - 1, 10), MAX_BACKOFF_SECONDS))
