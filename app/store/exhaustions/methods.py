"""Exhaustions (the durable level): a terminal failure kept in its row until its exact
acknowledgement, its deliveries to `exhaustion_url`, and the operators' bulk actions (redrive,
acknowledge) that commit batch by batch and record themselves once done."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, cast

from sqlalchemy import ColumnElement, Row, Table, Update, and_

from app.store import outbox, validate
from app.store.checks import check_actor, check_bots, check_identity, check_lease
from app.store.control import statements as control
from app.store.core import SqlCore
from app.store.exhaustions import statements as exhaustions
from app.store.operator_types import BulkOutcome, ExhaustionFilter
from app.store.types import DEFAULT_DESTINATION, ClaimIdentity, Exhaustion, identity_of

BULK_BATCH = 1_000  # rows per transaction of a bulk action


SAMPLE = 10  # identities a bulk action's answer shows


STATISTICS_AFTER = 1_000  # rows redriven that make the planner's statistics stale


Selection = ExhaustionFilter | Sequence[ClaimIdentity]


Progress = Callable[[int], None]


Cursor = tuple[str, int] | None  # a bulk action's place: the last key it took


class ExhaustionMethods(SqlCore):
    async def exhaust(
        self, identity: ClaimIdentity, at: int, error: str, *, status: int | None = None
    ) -> bool:
        self.require("durable", "exhaust")
        identity, at = check_identity(identity), validate.millis("at", at)
        error, status = validate.text("error", error), validate.status("status", status)
        stored = self._sealed_error(identity.bot, identity.update_id, error)
        table = self._delivery_table(identity.destination)
        statement = exhaustions.exhaust(table, identity=identity, at=at, error=stored)

        def created(row: Row[Any]) -> outbox.Made:
            return outbox.exhaustion(row, error=error, at=at, reason="failed", status_code=status)

        return await self._ended(
            statement,
            identity,
            event=created,
            at=at,
            outcome="exhausted",
            status=status,
            error=stored,
        )

    async def due_exhaustions(
        self,
        *,
        limit: int,
        after: tuple[str, int] | None = None,
        bots: Sequence[str] | None = None,
        destination: str = DEFAULT_DESTINATION,
    ) -> list[Exhaustion]:
        self.require("durable", "due_exhaustions")
        table = self._delivery_table(destination)
        if after is not None:
            if not isinstance(after, tuple) or len(after) != 2:
                raise ValueError(f"after {after!r} is not a (bot, update_id) cursor")
            after = (validate.bot_name(after[0]), validate.update_id(after[1]))
        names = check_bots(bots)
        if names == []:
            return []
        statement = exhaustions.due_exhaustions(
            table,
            limit=validate.positive("limit", limit),
            after=after,
            bots=names,
            destination=None if table is self.table else destination,
        )
        async with self._read() as connection:
            rows = (await connection.execute(statement)).all()
        return [self._exhaustion(row) for row in rows]

    async def take_exhaustions(
        self,
        *,
        now: int,
        lease_until: int,
        limit: int,
        bots: Sequence[str],
        destination: str = DEFAULT_DESTINATION,
    ) -> list[Exhaustion]:
        self.require("durable", "take_exhaustions")
        now, lease_until = check_lease(now, lease_until)
        table = self._delivery_table(destination)
        names = check_bots(bots)
        if not names:
            return []
        statement = exhaustions.take_exhaustions(
            table,
            now=now,
            lease_until=lease_until,
            limit=validate.positive("limit", limit),
            bots=names,
            destination=None if table is self.table else destination,
        )
        async with self._write() as connection:
            rows = (await connection.execute(statement)).all()
        return sorted(
            (self._exhaustion(row) for row in rows),
            key=lambda e: (e.identity.bot, e.identity.update_id),
        )

    async def delivery_failed(self, exhaustion: Exhaustion, retry_at: int) -> bool:
        self.require("durable", "delivery_failed")
        if not isinstance(exhaustion, Exhaustion):
            raise ValueError(f"exhaustion {exhaustion!r} is not an Exhaustion")
        identity = check_identity(exhaustion.identity)
        statement = exhaustions.delivery_failed(
            self._delivery_table(identity.destination),
            identity=identity,
            retry_at=validate.millis("retry_at", retry_at),
            deliveries=validate.count("deliveries", exhaustion.deliveries),
        )
        return await self._changed(statement)

    async def acknowledge_exhaustion(self, identity: ClaimIdentity, at: int) -> bool:
        self.require("durable", "acknowledge_exhaustion")
        identity = check_identity(identity)
        statement = exhaustions.acknowledge_exhaustion(
            self._delivery_table(identity.destination),
            identity=identity,
            at=validate.millis("at", at),
        )
        return await self._changed(statement)

    def _exhaustion(self, row: Any) -> Exhaustion:
        body, unreadable = self._body_or_why(row)
        return Exhaustion(
            identity=identity_of(row),
            body=body,
            error=self._error(row),
            exhausted_at=row.exhausted_at,
            deliveries=row.deliveries,
            trace_context=getattr(row, "trace_context", None),  # None below 0007
            unreadable=unreadable,
        )

    def _selected_table(self, selection: Selection) -> Table:
        """The one table a bulk action's selection is in: its destination's (a filter names
        one; named identities must share one)."""
        if isinstance(selection, ExhaustionFilter):
            return self._delivery_table(selection.destination)
        destinations = {check_identity(identity).destination for identity in selection}
        if len(destinations) > 1:
            raise ValueError(
                f"identities of destinations {sorted(destinations)}: one action per destination"
            )
        return self._delivery_table(destinations.pop() if destinations else DEFAULT_DESTINATION)

    async def _rule(
        self, selection: Selection, table: Table
    ) -> tuple[ColumnElement[bool], dict[str, Any]]:
        if isinstance(selection, ExhaustionFilter):
            criteria = {
                name: getattr(selection, name)
                for name in selection.__dataclass_fields__
                if getattr(selection, name) is not None
            }
            if selection.destination == DEFAULT_DESTINATION:  # named only when another's
                del criteria["destination"]
            if "bots" in criteria:
                criteria["bots"] = list(criteria["bots"])
            stored = dataclasses.replace(selection, chat=self.codec.digest_optional(selection.chat))
            if selection.error_contains is not None and self.codec.encrypting:
                # Sealed errors: the database selects by the other criteria, the store opens
                # their errors and keeps the keys whose error holds the text.
                others = dataclasses.replace(stored, error_contains=None)
                rule = exhaustions.exhaustions_matching(table, others)
                found = await self._errors_holding(table, rule, selection.error_contains)
                return and_(rule, exhaustions.keys_in(table, found)), {"filter": criteria}
            return exhaustions.exhaustions_matching(table, stored), {"filter": criteria}
        identities = [check_identity(identity) for identity in selection]
        keys = [f"{i.bot}/{i.update_id}/{i.attempt}" for i in identities]
        return exhaustions.exhaustions_exactly(table, identities), {"identities": keys}

    async def _errors_holding(
        self, table: Table, rule: ColumnElement[bool], text: str
    ) -> list[tuple[str, int]]:
        """The keys of the exhaustions `rule` selects whose opened error holds `text`, read a
        page of BULK_BATCH at a time."""
        found: list[tuple[str, int]] = []
        after: Cursor = None
        while True:
            statement = exhaustions.errors_of_exhaustions(
                table, rule, after=after, limit=BULK_BATCH
            )
            async with self._read() as connection:
                rows = (await connection.execute(statement)).all()
            found += [(row.bot, row.update_id) for row in rows if text in (self._error(row) or "")]
            if len(rows) < BULK_BATCH:
                return found
            after = (rows[-1].bot, rows[-1].update_id)

    async def _dry_run(self, table: Table, rule: ColumnElement[bool]) -> BulkOutcome:
        async with self._read() as connection:
            matched = await connection.execute(exhaustions.count_exhaustions(table, rule))
            sample = await connection.execute(
                exhaustions.sample_exhaustions(table, rule, limit=SAMPLE)
            )
            return BulkOutcome(int(matched.scalar_one()), 0, [self._exhaustion(r) for r in sample])

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

        def batch(table: Table, rule: ColumnElement[bool], after: Cursor, done: int) -> Update:
            start = at + int(done * interval)  # the pace goes on from the last batch
            return exhaustions.redrive(
                table, rule, after=after, limit=BULK_BATCH, start=start, interval_ms=interval
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
        bots, _, _ = self._operator_tables("redrive")
        controls = bots  # default's rate is the bot's; another destination has its own
        if self._selected_table(selection) is not self.table:
            controls = self._needing(self.destinations_table, "redrive", "0010")
        async with self._read() as connection:
            statement = control.bot_controls(controls, sorted(names))
            if controls is not bots:
                destination = _destination(selection)
                statement = statement.where(controls.c.destination == destination)
            row = (await connection.execute(statement)).first()
        return None if row is None else cast(float | None, row.rate_per_second)

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

        def batch(table: Table, rule: ColumnElement[bool], after: Cursor, done: int) -> Update:
            return exhaustions.acknowledge_exhaustions(
                table, rule, after=after, limit=BULK_BATCH, at=at
            )

        return await self._in_batches(
            "acknowledge", selection, batch, at=at, by=by, dry_run=dry_run, progress=progress
        )

    async def _in_batches(
        self,
        action: str,
        selection: Selection,
        batch: Callable[[Table, ColumnElement[bool], Cursor, int], Update],
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
        at, by = validate.millis("at", at), check_actor(by)
        table = self._selected_table(selection)
        rule, selected = await self._rule(selection, table)
        if validate.flag("dry_run", dry_run):
            return await self._dry_run(table, rule)
        sample = (await self._dry_run(table, rule)).sample
        done = 0
        cursor: Cursor = None
        while True:
            async with self.transaction() as connection:
                keys = (await connection.execute(batch(table, rule, cursor, done))).all()
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
                await self._emit(connection, [outbox.Made("redrive.finished", at, data)])
        return BulkOutcome(done, done, sample)


def _bots(selection: Selection) -> list[str] | None:
    """The bots a bulk action concerns: None (every bot) for a filter that names none."""
    if isinstance(selection, ExhaustionFilter):
        return None if not selection.bots else list(selection.bots)
    return sorted({identity.bot for identity in selection})


def _destination(selection: Selection) -> str:
    """The destination a selection is of (identities share one: `_selected_table`)."""
    if isinstance(selection, ExhaustionFilter):
        return selection.destination
    return next(iter(selection)).destination if selection else DEFAULT_DESTINATION


def _target(selection: Selection) -> str:
    """What an action's audit entry names: the bots (or every exhaustion), with the
    destination beside `default` when it is another's."""
    if isinstance(selection, ExhaustionFilter):
        bots = "exhaustions" if not selection.bots else ",".join(selection.bots)
    else:
        bots = ",".join(sorted({identity.bot for identity in selection})) or "exhaustions"
    destination = _destination(selection)
    return bots if destination == DEFAULT_DESTINATION else f"{bots}/{destination}"
