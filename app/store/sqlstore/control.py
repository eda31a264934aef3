"""Operator control (revision 0004): pause and resume, the rate limiter's shared bucket, bulk
redrive and acknowledgement, park, search, attempt history and the audit log.

Every action writes its audit row in the transaction that acts, so an action and its record
commit together; a bulk action commits batch by batch and records itself once done.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import ColumnElement, Table, Update
from sqlalchemy.ext.asyncio import AsyncConnection

from app.store import control, events, history, validate
from app.store.errors import UPGRADE_HINT, SchemaError
from app.store.sqlstore.core import check_identity
from app.store.sqlstore.durable import DurableMethods, exhaustion_of
from app.store.types import (
    ActivitySlot,
    AttemptRecord,
    AuditEntry,
    BotControl,
    BulkOutcome,
    ClaimIdentity,
    ExhaustionFilter,
    SearchCursor,
    SearchPage,
    StoredUpdate,
    UpdateFilter,
)

BULK_BATCH = 1_000  # rows per transaction of a bulk action
SAMPLE = 10  # identities a bulk action's answer shows
STATISTICS_AFTER = 1_000  # rows redriven that make the planner's statistics stale
SEARCH_WINDOW = 1_000  # rows a body search reads per page, at most
MAX_REASON = 500
MAX_SLOTS = 10_000  # an activity query's slots (a day by the minute is 1,440)
Selection = ExhaustionFilter | Sequence[ClaimIdentity]
Progress = Callable[[int], None]
Cursor = tuple[str, int] | None  # a bulk action's place: the last key it took


class ControlMethods(DurableMethods):
    # -- tables ------------------------------------------------------------------------------

    def _operator_tables(self, feature: str) -> tuple[Table, Table, Table]:
        if self.bots_table is None or self.audit_table is None or self.attempts_table is None:
            raise SchemaError(
                f"{feature} needs revision 0004 (operator control) but table "
                f"{self.table.name!r} is at revision {self.revision}; {UPGRADE_HINT}"
            )
        return self.bots_table, self.audit_table, self.attempts_table

    async def _record(
        self,
        connection: AsyncConnection,
        *,
        at: int,
        by: str,
        action: str,
        target: str,
        bots: Sequence[str] | None,
        detail: dict[str, Any] | None = None,
        matched: int | None = None,
        changed: int | None = None,
    ) -> None:
        """Write one audit entry in the acting transaction, with the bots it concerns (None:
        every bot, as a filter that names none)."""
        _, audit, _ = self._operator_tables("the audit log")
        statement = control.record_action(
            audit,
            at=at,
            key_name=by,
            action=action,
            target=target,
            detail=None if detail is None else json.dumps(detail, sort_keys=True),
            matched=matched,
            changed=changed,
        )
        entry = (await connection.execute(statement)).scalar_one()
        # Below revision 0005 (an old table a newer process writes during an upgrade) the entry
        # concerns no bot: it is shown only to keys of every bot, never too widely.
        if bots and self.audit_bots_table is not None:
            records = control.record_action_bots(self.audit_bots_table, entry, sorted(set(bots)))
            await connection.execute(records)

    # -- bot controls ------------------------------------------------------------------------

    async def bot_controls(self, bots: Sequence[str] | None = None) -> list[BotControl]:
        """The controls of these bots (every bot with a row, when None), in bot order; a bot
        never paused nor limited has defaults."""
        table, _, _ = self._operator_tables("bot_controls")
        names = None if bots is None else [validate.bot_name(bot) for bot in bots]
        async with self._read() as connection:
            rows = (await connection.execute(control.bot_controls(table, names))).all()
        found = {row.bot: _control(row) for row in rows}
        if names is None:
            return list(found.values())
        return [found.get(name, BotControl(name)) for name in sorted(set(names))]

    async def pause(self, bot: str, *, at: int, by: str, reason: str | None = None) -> bool:
        """Pause `bot`: from this commit no claim of any process starts an attempt for it
        (attempts in flight finish); its updates are still recorded. True when this call
        paused it; a bot already paused keeps its first pause (and nothing is recorded)."""
        table, _, _ = self._operator_tables("pause")
        bot, at, by = validate.bot_name(bot), validate.millis("at", at), _actor(by)
        reason = _reason(reason)
        statement = control.pause(table, self.dialect, bot=bot, at=at, by=by, reason=reason)
        async with self.transaction() as connection:
            row = (await connection.execute(statement)).one()
            paused = bool(row.paused_at == at and row.paused_by == by)
            if paused:
                detail = None if reason is None else {"reason": reason}
                await self._record(
                    connection, at=at, by=by, action="pause", target=bot, bots=[bot], detail=detail
                )
                data = {"bot": bot, "by": by, "reason": reason, "paused_at": at}
                await self._emit(connection, [("bot.paused", at, data)])
        return paused

    async def resume(self, bot: str, *, at: int, by: str) -> bool:
        """Resume a paused bot and wake the workers of every process; False (nothing
        recorded) when it was not paused."""
        table, _, _ = self._operator_tables("resume")
        bot, at, by = validate.bot_name(bot), validate.millis("at", at), _actor(by)
        async with self.transaction() as connection:
            resumed = (await connection.execute(control.resume(table, bot=bot))).first()
            if resumed is not None:
                await self._record(
                    connection, at=at, by=by, action="resume", target=bot, bots=[bot]
                )
                data = {"bot": bot, "by": by, "resumed_at": at}
                await self._emit(connection, [("bot.resumed", at, data)])
        if resumed is not None:
            await self.announce()
        return resumed is not None

    async def set_rate_limit(self, bot: str, per_second: float | None, *, at: int, by: str) -> None:
        """At most `per_second` attempts start per second for `bot`, across every process
        (None lifts the limit). The limit's bucket starts empty."""
        table, _, _ = self._operator_tables("set_rate_limit")
        bot, at, by = validate.bot_name(bot), validate.millis("at", at), _actor(by)
        rate = validate.rate("per_second", per_second)
        statement = control.set_rate_limit(table, self.dialect, bot=bot, per_second=rate, at=at)
        async with self.transaction() as connection:
            await connection.execute(statement)
            await self._record(
                connection,
                at=at,
                by=by,
                action="rate_limit",
                target=bot,
                bots=[bot],
                detail={"per_second": rate},
            )
        if rate is None:
            await self.announce()

    async def take_tokens(self, bot: str, wanted: int, *, now: int) -> int:
        """How many of `wanted` attempts of `bot` may start now under its rate limit, taken
        from the bucket every process shares (all of them when it has no limit). Give back
        what was not used with `return_tokens`."""
        table, _, _ = self._operator_tables("take_tokens")
        bot, now = validate.bot_name(bot), validate.millis("now", now)
        wanted = validate.positive("wanted", wanted)
        async with self.transaction() as connection:
            row = (await connection.execute(control.bucket(table, bot=bot))).first()
            if row is None:
                return wanted
            rate = float(row.rate_per_second)
            # The bucket's clock never goes back: a caller whose `now` is behind the last
            # refill (read before it waited for this row's lock, or a process whose clock is a
            # little behind) refills nothing and leaves the refill time as it is. Moved back,
            # the next caller would be paid again for time already paid for.
            refilled = max(now, int(row.refilled_at))
            elapsed = refilled - int(row.refilled_at)
            tokens = min(max(rate, 1.0), float(row.tokens) + elapsed * rate / 1000)
            granted = min(wanted, int(tokens))
            spend = control.spend_tokens(table, bot=bot, tokens=tokens - granted, at=refilled)
            await connection.execute(spend)
        return granted

    async def return_tokens(self, bot: str, count: int) -> None:
        """Give back `count` tokens taken by `take_tokens` for attempts that did not start."""
        table, _, _ = self._operator_tables("return_tokens")
        statement = control.return_tokens(
            table, bot=validate.bot_name(bot), count=validate.positive("count", count)
        )
        async with self._write() as connection:
            await connection.execute(statement)

    async def report_breaker(self, bot: str, state: str, *, at: int) -> None:
        """Record the breaker transition a worker's breaker for `bot` just made. The shared
        row going from closed (or none) to open writes breaker.opened, and from open or
        half-open to closed breaker.closed: one event a change of the shared row, however
        many workers' breakers make it."""
        table, _, _ = self._operator_tables("report_breaker")
        if state not in ("closed", "open", "half_open"):
            raise ValueError(f"breaker state {state!r} is not closed, open or half_open")
        bot, at = validate.bot_name(bot), validate.millis("at", at)
        statement = control.report_breaker(table, self.dialect, bot=bot, state=state, at=at)
        if self._outbox() is None:
            async with self._write() as connection:
                await connection.execute(statement)
            return
        async with self.transaction() as connection:
            await connection.execute(control.ensure_bot(table, self.dialect, bot=bot))
            before = (await connection.execute(control.breaker_of(table, bot=bot))).scalar()
            await connection.execute(statement)
            kind = control.breaker_event(before, state)
            if kind is not None:
                await self._emit(connection, [(kind, at, {"bot": bot, "at": at})])

    # -- exhaustions in bulk -----------------------------------------------------------------

    def _rule(self, selection: Selection) -> tuple[ColumnElement[bool], dict[str, Any]]:
        if isinstance(selection, ExhaustionFilter):
            criteria = {
                name: getattr(selection, name)
                for name in selection.__dataclass_fields__
                if getattr(selection, name) is not None
            }
            if "bots" in criteria:
                criteria["bots"] = list(criteria["bots"])
            return control.exhaustions_matching(self.table, selection), {"filter": criteria}
        identities = [check_identity(identity) for identity in selection]
        keys = [f"{i.bot}/{i.update_id}/{i.attempt}" for i in identities]
        return control.exhaustions_exactly(self.table, identities), {"identities": keys}

    async def _dry_run(self, rule: ColumnElement[bool]) -> BulkOutcome:
        async with self._read() as connection:
            matched = await connection.execute(control.count_exhaustions(self.table, rule))
            sample = await connection.execute(
                control.sample_exhaustions(self.table, rule, limit=SAMPLE)
            )
            return BulkOutcome(int(matched.scalar_one()), 0, [exhaustion_of(r) for r in sample])

    async def redrive(
        self,
        selection: Selection,
        *,
        at: int,
        by: str,
        dry_run: bool = False,
        rate_per_second: float | None = None,
        progress: Progress | None = None,
    ) -> BulkOutcome:
        """Deliver the selected open exhaustions again: each becomes a retry with a fresh
        attempt budget, due from `at` paced at `rate_per_second` in key order, its attempt
        numbers continuing. Without a rate, a selection of one bot goes at that bot's rate
        limit, and any other all at once. A dry run counts exactly what a real run would take
        now, and changes nothing. `progress` hears the count redriven so far."""
        self._operator_tables("redrive")
        rate = validate.rate("rate_per_second", rate_per_second)
        if rate is None and not dry_run:
            rate = await self._one_bots_rate(selection)
        interval = 0.0 if rate is None else 1000.0 / rate

        def batch(rule: ColumnElement[bool], after: Cursor, done: int) -> Update:
            start = at + int(done * interval)  # the pace goes on from the last batch
            return control.redrive(
                self.table, rule, after=after, limit=BULK_BATCH, start=start, interval_ms=interval
            )

        outcome = await self._in_batches(
            "redrive", selection, batch, at=at, by=by, dry_run=dry_run, progress=progress,
            detail={"rate_per_second": rate},
        )  # fmt: skip
        if outcome.changed >= STATISTICS_AFTER:
            # Thousands of rows just became due: the planner's statistics still say they are
            # settled, and the claims plan for a handful until the workers' next gather (up to
            # 10 s away), delivering at a fraction of the pace meanwhile (measured).
            await self.refresh_statistics(min_changes=STATISTICS_AFTER, min_age_seconds=0)
        if outcome.changed:
            await self.announce()
        return outcome

    async def _one_bots_rate(self, selection: Selection) -> float | None:
        """The rate limit of the one bot a selection names, if it names one and it has one."""
        if isinstance(selection, ExhaustionFilter):
            names = set(selection.bots or ())
        else:
            names = {identity.bot for identity in selection}
        if len(names) != 1:
            return None
        controls = await self.bot_controls(list(names))
        return controls[0].rate_per_second

    async def acknowledge_exhaustions(
        self,
        selection: Selection,
        *,
        at: int,
        by: str,
        dry_run: bool = False,
        progress: Progress | None = None,
    ) -> BulkOutcome:
        """Acknowledge the selected open exhaustions (each as `acknowledge_exhaustion` does
        one); a dry run counts exactly what a real run would take now."""
        self._operator_tables("acknowledge_exhaustions")

        def batch(rule: ColumnElement[bool], after: Cursor, done: int) -> Update:
            return control.acknowledge_exhaustions(
                self.table, rule, after=after, limit=BULK_BATCH, at=at
            )

        return await self._in_batches(
            "acknowledge", selection, batch, at=at, by=by, dry_run=dry_run, progress=progress
        )

    async def _in_batches(
        self,
        action: str,
        selection: Selection,
        batch: Callable[[ColumnElement[bool], Cursor, int], Update],
        *,
        at: int,
        by: str,
        dry_run: bool,
        progress: Progress | None,
        detail: dict[str, Any] | None = None,
    ) -> BulkOutcome:
        """A bulk action: the dry run's count and sample, or `batch` after batch (each given
        the rule, the cursor and the count so far; each its own transaction) until one comes
        up short, then one audit record of the whole."""
        at, by = validate.millis("at", at), _actor(by)
        rule, selected = self._rule(selection)
        if validate.flag("dry_run", dry_run):
            return await self._dry_run(rule)
        sample = (await self._dry_run(rule)).sample
        done = 0
        cursor: Cursor = None
        while True:
            async with self.transaction() as connection:
                keys = (await connection.execute(batch(rule, cursor, done))).all()
            done += len(keys)
            if progress is not None and keys:
                progress(done)
            if len(keys) < BULK_BATCH:
                break
            cursor = max((row.bot, row.update_id) for row in keys)
        async with self.transaction() as connection:
            await self._record(
                connection,
                at=at,
                by=by,
                action=action,
                target=_target(selection),
                bots=_bots(selection),
                detail=selected | (detail or {}),
                matched=done,
                changed=done,
            )
            if action == "redrive":
                data = {"target": _target(selection), "by": by, "redriven": done, **(detail or {})}
                if "filter" in selected:
                    data["filter"] = selected["filter"]
                else:  # the identities are in the audit log; the event tells how many
                    data["identities"] = len(selected["identities"])
                await self._emit(connection, [("redrive.finished", at, data)])
        return BulkOutcome(done, done, sample)

    async def park(self, identity: ClaimIdentity, *, at: int, by: str, reason: str) -> bool:
        """End the attempt of exactly `identity` (leased, live or lapsed, or waiting for its
        retry) as an exhaustion with `reason`, which unblocks its chat; its late settle is
        refused as any lost claim's. False (nothing changed) for any other identity."""
        _, _, attempts = self._operator_tables("park")
        identity, at, by = check_identity(identity), validate.millis("at", at), _actor(by)
        text = _reason(reason)
        if not text:
            raise ValueError("reason is required to park an update")
        statement = control.park(self.table, identity=identity, at=at, reason=text)
        follow = None
        if self.keeps_history:
            follow = history.ended(attempts, identity, at=at, outcome="parked", error=text)
        async with self.transaction() as connection:
            parked = await self._backend.transition(connection, statement, follow)
            if parked is not None:
                data = events.exhaustion(parked, error=f"parked: {text}", at=at, reason="parked")
                await self._emit(connection, [("exhaustion.created", at, data | {"by": by})])
                await self._record(
                    connection,
                    at=at,
                    by=by,
                    action="park",
                    target=f"{identity.bot}/{identity.update_id}",
                    bots=[identity.bot],
                    detail={"attempt": identity.attempt, "reason": text},
                    matched=1,
                    changed=1,
                )
        if parked is not None:
            await self.announce()
        return parked is not None

    # -- reads -------------------------------------------------------------------------------

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
        statement = control.search_updates(self.table, chosen, after=after, limit=window)
        async with self._read() as connection:
            rows = (await connection.execute(statement)).all()
        hits = [row for row in rows if row.hit]
        if len(hits) >= limit:
            hits = hits[:limit]
            last = hits[-1]
        else:  # the window ran out first: go on after its last row, if it was full
            last = rows[-1] if len(rows) == window else None
        cursor = None if last is None else (last.received_at, last.bot, last.update_id)
        return SearchPage([_summary(row) for row in hits], cursor)

    async def attempt_history(self, bot: str, update_id: int) -> list[AttemptRecord] | None:
        """Every attempt of the update recorded so far, oldest first; None when no such update
        is recorded."""
        _, _, table = self._operator_tables("attempts")
        bot, update_id = validate.bot_name(bot), validate.update_id(update_id)
        async with self._read() as connection:
            row = (
                await connection.execute(
                    control.update_state(self.table, bot=bot, update_id=update_id)
                )
            ).first()
            if row is None:
                return None
            records = (
                await connection.execute(history.of_update(table, bot=bot, update_id=update_id))
            ).all()
        leased = row.state == "processing"
        return [
            AttemptRecord(
                attempt=record.attempt,
                claim_id=record.claim_id,
                started_at=record.started_at,
                ended_at=record.ended_at,
                outcome=history.read_end(record, current_attempt=row.attempts, leased=leased),
                status_code=record.status_code,
                error=record.error,
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
        statement = control.activity(self.table, bots=names, since=since, slot_ms=slot_ms)
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
        statement = control.audit_log(
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
                detail=row.detail,
                matched=row.matched,
                changed=row.changed,
            )
            for row in rows
        ]


def _slot_order(item: tuple[tuple[str, int], list[int]]) -> tuple[int, str]:
    (bot, slot), _ = item
    return slot, bot


def _control(row: Any) -> BotControl:
    return BotControl(
        bot=row.bot,
        paused_at=row.paused_at,
        paused_by=row.paused_by,
        paused_reason=row.paused_reason,
        rate_per_second=row.rate_per_second,
        breaker=row.breaker,
        breaker_at=row.breaker_at,
        webhook_pending=row.webhook_pending,
        webhook_error_date=row.webhook_error_date,
        webhook_error_message=row.webhook_error_message,
        webhook_checked_at=row.webhook_checked_at,
    )


def _summary(row: Any) -> StoredUpdate:
    return StoredUpdate(**{name: getattr(row, name) for name in control.SUMMARY})


def _actor(by: Any) -> str:
    """The name an action is recorded under: an API key's name, or the CLI's user."""
    if not isinstance(by, str) or not 0 < len(by) <= 200:
        raise ValueError(f"by {by!r} is not a name of 1 to 200 characters")
    return by


def _reason(reason: Any) -> str | None:
    if reason is None:
        return None
    reason = validate.text("reason", reason).strip()
    if len(reason) > MAX_REASON:
        raise ValueError(f"reason is over {MAX_REASON} characters")
    return reason or None


def _cursor(value: Any) -> SearchCursor:
    if not isinstance(value, tuple) or len(value) != 3:
        raise ValueError(f"after {value!r} is not a (received_at, bot, update_id) cursor")
    return (
        validate.millis("received_at", value[0]),
        validate.bot_name(value[1]),
        validate.update_id(value[2]),
    )


def _bots(selection: Selection) -> list[str] | None:
    """The bots a bulk action concerns: None (every bot) for a filter that names none."""
    if isinstance(selection, ExhaustionFilter):
        return None if not selection.bots else list(selection.bots)
    return sorted({identity.bot for identity in selection})


def _target(selection: Selection) -> str:
    if isinstance(selection, ExhaustionFilter):
        return "exhaustions" if not selection.bots else ",".join(selection.bots)
    return ",".join(sorted({identity.bot for identity in selection})) or "exhaustions"
