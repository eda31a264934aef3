"""Operational events (revision 0004, docs/contract.md section 9): the outbox's delivery under a
lease, the backlog watch and the getWebhookInfo watch. The events themselves are written by the
methods whose transactions make them (`SqlCore._emit`, and the claims' own statements)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import cast

from sqlalchemy import Table

from app.store import outbox as outbox_statements
from app.store import validate
from app.store.checks import check_lease
from app.store.control import statements as control
from app.store.core import SqlCore
from app.store.errors import UPGRADE_HINT, SchemaError, Undecryptable
from app.store.events import statements as events
from app.store.operator_types import EventType, OperationalEvent, WebhookInfo

log = logging.getLogger(__name__)


class EventMethods(SqlCore):
    def _events_tables(self, feature: str) -> tuple[Table, Table]:
        if self.events_table is None or self.bots_table is None:
            raise SchemaError(
                f"{feature} needs revision 0004 (operator control) but table "
                f"{self.table.name!r} is at revision {self.revision}; {UPGRADE_HINT}"
            )
        return self.events_table, self.bots_table

    # -- the outbox --------------------------------------------------------------------------

    async def take_events(
        self, *, now: int, lease_until: int, limit: int
    ) -> list[OperationalEvent]:
        """Lease up to `limit` undelivered events due now (oldest first) until `lease_until`:
        no other process takes them meanwhile. Each comes with its body as delivered."""
        outbox, _ = self._events_tables("take_events")
        now, lease_until = check_lease(now, lease_until)
        statement = events.take(
            outbox, now=now, lease_until=lease_until, limit=validate.positive("limit", limit)
        )
        async with self._write() as connection:
            rows = (await connection.execute(statement)).all()
        taken = []
        for row in rows:
            try:
                data = outbox_statements.opened_data(row, self.codec)
            except Undecryptable as error:  # kept, and tried again once its key is back
                log.error("operational event %s not delivered: %s", row.id, error)
                continue
            taken.append(
                OperationalEvent(
                    id=row.id,
                    type=cast(EventType, row.type),
                    payload=outbox_statements.envelope(row.type, row.created_at, data),
                    created_at=row.created_at,
                    deliveries=row.deliveries,
                    lease_until=row.due_at,
                    trace_context=getattr(row, "trace_context", None),  # None below 0008
                )
            )
        return sorted(taken, key=lambda event: event.id)

    async def event_delivered(self, event: OperationalEvent, at: int) -> bool:
        """The receiver took `event` (a 2xx): it is never sent again. False when its lease
        lapsed and another delivery took it over (that one says how it went)."""
        outbox, _ = self._events_tables("event_delivered")
        statement = events.delivered(
            outbox,
            event_id=validate.positive("id", event.id),
            lease_until=validate.millis("lease_until", event.lease_until),
            at=validate.millis("at", at),
        )
        return await self._changed(statement)

    async def event_failed(self, event: OperationalEvent, retry_at: int) -> bool:
        """A delivery of `event` failed: due again at `retry_at`, one more failure counted.
        False when its lease lapsed meanwhile."""
        outbox, _ = self._events_tables("event_failed")
        statement = events.failed(
            outbox,
            event_id=validate.positive("id", event.id),
            lease_until=validate.millis("lease_until", event.lease_until),
            retry_at=validate.millis("retry_at", retry_at),
        )
        return await self._changed(statement)

    # -- the watches -------------------------------------------------------------------------

    async def watch_backlog(
        self, bots: Sequence[str], *, now: int, stale_after_ms: int
    ) -> list[str]:
        """Of `bots`, those whose oldest pending, processing or failed row was received over
        `stale_after_ms` ago. A bot that becomes stale writes backlog.stale once (across every
        process) until its backlog is fresh again; the bots that did so now are returned."""
        _, table = self._events_tables("watch_backlog")
        names = sorted({validate.bot_name(bot) for bot in bots})
        now = validate.millis("now", now)
        stale_after_ms = validate.positive("stale_after_ms", stale_after_ms)
        if not names:
            return []
        async with self._read() as connection:
            rows = (await connection.execute(events.oldest_undelivered(self.table, names))).all()
        stale = {row.bot: int(row.oldest) for row in rows if now - row.oldest > stale_after_ms}
        began: list[str] = []
        async with self.transaction() as connection:
            for bot, oldest in sorted(stale.items()):
                statement = events.became_stale(table, self._backend.upsert, bot=bot, at=now)
                if (await connection.execute(statement)).first() is None:
                    continue
                began.append(bot)
                data = {
                    "bot": bot,
                    "oldest_received_at": oldest,
                    "age_ms": now - oldest,
                    "stale_after_ms": stale_after_ms,
                }
                await self._emit(connection, [outbox_statements.Made("backlog.stale", now, data)])
            await connection.execute(events.fresh_again(table, stale=sorted(stale), watched=names))
        return began

    async def take_webhook_check(self, bot: str, *, now: int, next_at: int) -> bool:
        """Whether this process makes `bot`'s getWebhookInfo check now: True to one caller
        while the check is due, which moves the next one to `next_at` for every process."""
        _, table = self._events_tables("take_webhook_check")
        now, next_at = check_lease(now, next_at)
        statement = events.take_webhook_check(
            table, self._backend.upsert, bot=validate.bot_name(bot), now=now, next_at=next_at
        )
        return await self._changed(statement)

    async def report_webhook_info(self, bot: str, info: WebhookInfo, *, at: int) -> bool:
        """Keep what a getWebhookInfo check saw, for every process's metrics; a last error
        newer than the one kept writes telegram.webhook_error (returned True)."""
        _, table = self._events_tables("report_webhook_info")
        bot, at = validate.bot_name(bot), validate.millis("at", at)
        if not isinstance(info, WebhookInfo):
            raise ValueError(f"{info!r} is not a WebhookInfo")
        async with self.transaction() as connection:
            await connection.execute(control.ensure_bot(table, self._backend.upsert, bot=bot))
            seen = (await connection.execute(events.webhook_seen(table, bot=bot))).scalar()
            await connection.execute(events.webhook_checked(table, bot=bot, info=info, at=at))
            date = info.last_error_date
            new = date is not None and (seen is None or date > seen)
            if new:
                data = {
                    "bot": bot,
                    "last_error_date": date,
                    "last_error_message": info.last_error_message,
                    "pending_update_count": info.pending_update_count,
                }
                made = outbox_statements.Made("telegram.webhook_error", at, data)
                await self._emit(connection, [made])
        return new
