"""What operators read: one update, counts by bot and state, the search, one update's attempt
history, activity by time slot and the audit log."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any

from app.store import history, validate
from app.store.control import statements as control
from app.store.core import SqlCore
from app.store.operator_types import (
    ActivitySlot,
    AttemptRecord,
    AuditEntry,
    SearchCursor,
    SearchPage,
    UpdateFilter,
)
from app.store.types import DEFAULT_DESTINATION, BotStats, StoredDelivery, StoredUpdate
from app.store.views import statements as views

_UNDELIVERED = ("pending", "processing", "failed")


SEARCH_WINDOW = 1_000  # rows a body search reads per page, at most


MAX_SLOTS = 10_000  # an activity query's slots (a day by the minute is 1,440)


class ViewMethods(SqlCore):
    async def get_update(self, bot: str, update_id: int) -> StoredUpdate | None:
        """The row of `(bot, update_id)` as it stands, with its deliveries beside it (revision
        0010), or None."""
        bot, update_id = validate.bot_name(bot), validate.update_id(update_id)
        statement = views.get_update(self.table, bot=bot, update_id=update_id)
        async with self._read() as connection:
            row = (await connection.execute(statement)).first()
            beside = []
            if row is not None and self.deliveries_table is not None:
                listed = views.deliveries_of(self.deliveries_table, bot=bot, update_id=update_id)
                beside = (await connection.execute(listed)).all()
        if row is None:
            return None
        fields: dict[str, Any] = dict(row._mapping)
        fields["deliveries"] = tuple(self._delivery(delivery) for delivery in beside)
        fields["destination"] = DEFAULT_DESTINATION  # the row's own delivery
        fields["body"], unreadable = self._body_or_why(row)
        if fields.get("erased_at") is not None:
            fields["body"] = None  # erased by retention: the row stays, its body does not
        elif unreadable is not None:
            fields["body"] = None  # shown as absent, with why in place of its error
            fields["error"] = f"[unreadable: {unreadable}]"
        else:
            fields["error"] = self._error(row)
        chosen: dict[str, Any] = {n: fields.get(n) for n in StoredUpdate.__dataclass_fields__}
        return StoredUpdate(**chosen)

    def _delivery(self, row: Any) -> StoredDelivery:
        names = StoredDelivery.__dataclass_fields__
        return StoredDelivery(**{n: getattr(row, n) for n in names} | {"error": self._error(row)})

    def _summary(self, row: Any, destination: str) -> StoredUpdate:
        fields = {name: getattr(row, name) for name in views.SUMMARY}
        erased = getattr(row, "erased_at", None)  # revision 0009
        shown = {"error": self._error(row), "erased_at": erased, "destination": destination}
        return StoredUpdate(**(fields | shown))

    async def stats(self, *, deliveries: bool = False) -> list[BotStats]:
        """Rows by bot and state, in bot order (one scan of the table: an operator's call).
        With `deliveries`, the deliveries beside the rows (revision 0010) by bot, destination
        and state instead (none below it)."""
        table = self.deliveries_table if deliveries else self.table
        if table is None:
            return []
        async with self._read() as connection:
            rows = (await connection.execute(views.stats(table))).all()
        durable = "exhausted_at" in table.c
        result: list[BotStats] = []
        for (bot, destination), group in itertools.groupby(
            rows, key=lambda row: (row.bot, getattr(row, "destination", DEFAULT_DESTINATION))
        ):
            states = list(group)
            undelivered = [row.oldest for row in states if row.state in _UNDELIVERED]
            result.append(
                BotStats(
                    bot=bot,
                    states={row.state: int(row.rows) for row in states},
                    oldest_undelivered_at=min(undelivered, default=None),
                    unacknowledged_exhaustions=(
                        sum(int(row.unacknowledged or 0) for row in states) if durable else None
                    ),
                    destination=destination,
                )
            )
        return result

    async def search_updates(
        self, chosen: UpdateFilter, *, after: SearchCursor | None = None, limit: int = 50
    ) -> SearchPage:
        """Rows matching `chosen`, newest first by (received_at, bot, update_id), a page at a
        time after the cursor. With `contains`, each page reads at most SEARCH_WINDOW rows of
        the other filters and returns those whose body holds the text: a page may be short,
        even empty, while `next` says where to go on."""
        self._operator_tables("search_updates")
        if not isinstance(chosen, UpdateFilter):
            raise ValueError(f"{chosen!r} is not an UpdateFilter")
        limit = validate.positive("limit", limit)
        if after is not None:
            after = _cursor(after)
        window = limit if chosen.contains is None else max(limit, SEARCH_WINDOW)
        sealed = self.codec.encrypting
        if chosen.user is not None:
            self._needing(self.erasures_table, "search by user", "0009")
        stored = dataclasses.replace(
            chosen,
            chat=self.codec.digest_optional(chosen.chat),
            user=self.codec.digest_optional(chosen.user),
        )
        deliveries = None
        if chosen.destination not in (None, DEFAULT_DESTINATION):
            deliveries = self._delivery_table(chosen.destination)
        statement = views.search_updates(
            self.table,
            stored,
            after=after,
            limit=window,
            sealed_bodies=sealed,
            deliveries=deliveries,
        )
        async with self._read() as connection:
            rows = (await connection.execute(statement)).all()
        if sealed and chosen.contains is not None:
            # Opened here, within the window: the database holds ciphertext only.
            hits = [row for row in rows if chosen.contains in self._body_or_why(row)[0]]
        else:
            hits = [row for row in rows if row.hit]
        if len(hits) >= limit:
            hits = hits[:limit]
            last = hits[-1]
        else:  # the window ran out first: go on after its last row, if it was full
            last = rows[-1] if len(rows) == window else None
        cursor = None if last is None else (last.received_at, last.bot, last.update_id)
        seen_from = chosen.destination or DEFAULT_DESTINATION
        return SearchPage([self._summary(row, seen_from) for row in hits], cursor)

    async def attempt_history(
        self, bot: str, update_id: int, *, destination: str = DEFAULT_DESTINATION
    ) -> list[AttemptRecord] | None:
        """Every attempt of the update's delivery to `destination` recorded so far, oldest
        first; None when no such update (or no such delivery of it) is recorded."""
        _, _, attempts = self._operator_tables("attempts")
        bot, update_id = validate.bot_name(bot), validate.update_id(update_id)
        table = self._delivery_table(destination)
        if table is not self.table:
            kept = self._backend.history_of(table)
            attempts = self._needing(self.delivery_attempts_table, "attempts", "0010")
            if kept is not None:
                attempts = kept.attempts
        state = control.update_state(table, bot=bot, update_id=update_id, destination=destination)
        tried = history.of_update(attempts, bot=bot, update_id=update_id, destination=destination)
        async with self._read() as connection:
            row = (await connection.execute(state)).first()
            if row is None:
                return None
            records = (await connection.execute(tried)).all()
        leased = row.state == "processing"
        return [
            AttemptRecord(
                attempt=record.attempt,
                claim_id=record.claim_id,
                started_at=record.started_at,
                ended_at=record.ended_at,
                outcome=history.read_end(record, current_attempt=row.attempts, leased=leased),
                status_code=record.status_code,
                error=self._error(record),
                worker=record.worker,
            )
            for record in records
        ]

    async def activity(
        self, bots: Sequence[str], *, since: int, until: int, slot_ms: int
    ) -> list[ActivitySlot]:
        """Updates received and delivered per bot in each slot of `slot_ms` from `since` to
        `until` (every slot, zeros included), oldest first."""
        self._operator_tables("activity")
        names = sorted({validate.bot_name(bot) for bot in bots})
        since, until = validate.millis("since", since), validate.millis("until", until)
        slot_ms = validate.positive("slot_ms", slot_ms)
        slots = (until - since + slot_ms - 1) // slot_ms
        if not names or slots <= 0:
            return []
        if slots > MAX_SLOTS:
            raise ValueError(f"{slots} slots of {slot_ms} ms: at most {MAX_SLOTS}")
        statement = views.activity(self.table, bots=names, since=since, slot_ms=slot_ms)
        async with self._read() as connection:
            rows = (await connection.execute(statement)).all()
        counts = {(bot, slot): [0, 0] for bot in names for slot in range(slots)}
        for row in rows:
            found = counts.get((row.bot, int(row.slot)))
            if found is not None:  # a row after `until` (a clock ahead) is left out
                found[0] += int(row.received)
                found[1] += int(row.delivered)
        return [
            ActivitySlot(bot, since + slot * slot_ms, received, delivered)
            for (bot, slot), (received, delivered) in sorted(counts.items(), key=_slot_order)
        ]

    async def audit_log(
        self, *, after: int | None = None, limit: int = 100, bots: Sequence[str] | None = None
    ) -> list[AuditEntry]:
        """Operator actions, newest first, a page at a time (`after`: the last id seen); with
        `bots`, only those that concern none but them."""
        _, audit, _ = self._operator_tables("audit_log")
        limit = validate.positive("limit", limit)
        if after is not None:
            after = validate.positive("after", after)
        if bots is not None:
            bots = [validate.bot_name(bot) for bot in bots]
            self._needing(self.audit_bots_table, "the audit log of some bots", "0005")
        statement = views.audit_log(
            audit, self.audit_bots_table, after=after, limit=limit, bots=bots
        )
        async with self._read() as connection:
            rows = (await connection.execute(statement)).all()
        return [
            AuditEntry(
                id=row.id,
                at=row.at,
                key_name=row.key_name,
                action=row.action,
                target=row.target,
                detail=self._audit_detail(row),
                matched=row.matched,
                changed=row.changed,
            )
            for row in rows
        ]


def _slot_order(item: tuple[tuple[str, int], list[int]]) -> tuple[int, str]:
    (bot, slot), _ = item
    return slot, bot


def _cursor(value: Any) -> SearchCursor:
    if not isinstance(value, tuple) or len(value) != 3:
        raise ValueError(f"after {value!r} is not a (received_at, bot, update_id) cursor")
    return (
        validate.millis("received_at", value[0]),
        validate.bot_name(value[1]),
        validate.update_id(value[2]),
    )
