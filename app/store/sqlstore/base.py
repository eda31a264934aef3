"""The base level (docs/contract.md section 4): record, claim by key, renew, settle, list due,
prune; and the operators' views of what is recorded."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence

from app.store import events, queries, validate
from app.store.engine import translated_errors
from app.store.sqlstore.core import (
    SqlCore,
    check_bots,
    check_lease,
    check_settlement,
)
from app.store.types import (
    BotStats,
    DueUpdate,
    NewUpdate,
    Settlement,
    StoredUpdate,
)

_UNDELIVERED = ("pending", "processing", "failed")
PRUNE_BATCH = 2_000  # rows a prune deletes per transaction


class BaseMethods(SqlCore):
    async def add(
        self,
        bot: str,
        update_id: int,
        body: str,
        received_at: int,
        *,
        update_type: str | None = None,
        queue_key: str | None = None,
    ) -> bool:
        row = NewUpdate(bot, update_id, body, received_at, update_type, queue_key)
        return bool(await self.add_many([row]))

    async def add_many(self, rows: Sequence[NewUpdate]) -> set[tuple[str, int]]:
        """Record many updates in one statement and one commit; the keys that were new."""
        for row in rows:
            if not isinstance(row, NewUpdate):
                raise ValueError(f"row {row!r} is not a NewUpdate")
        if not rows:
            return set()
        with translated_errors(self.table.name):
            added = await self._backend.add_many(rows)
        assert added is not None  # no guard
        return {(row.bot, row.update_id) for row in added}

    async def claim(
        self,
        bot: str,
        update_id: int,
        *,
        now: int,
        lease_until: int,
        max_attempts: int,
        durable_exhaustion: bool = False,
    ) -> int | None:
        if validate.flag("durable_exhaustion", durable_exhaustion):
            self.require("durable", "claim(durable_exhaustion=True)")
        now, lease_until = check_lease(now, lease_until)
        statement = queries.claim(
            self.table,
            bot=validate.bot_name(bot),
            update_id=validate.update_id(update_id),
            now=now,
            lease_until=lease_until,
            max_attempts=validate.attempts("max_attempts", max_attempts),
            durable_exhaustion=durable_exhaustion,
        )
        async with self._write() as connection:
            row = (await connection.execute(statement)).first()
        return int(row.attempts) if row is not None and row.state == "processing" else None

    async def renew(
        self, bot: str, update_id: int, attempt: int, lease_until: int, now: int | None = None
    ) -> bool:
        statement = queries.renew(
            self.table,
            bot=validate.bot_name(bot),
            update_id=validate.update_id(update_id),
            attempt=validate.attempts("attempt", attempt),
            lease_until=validate.millis("lease_until", lease_until),
            now=None if now is None else validate.millis("now", now),
        )
        return await self._changed(statement)

    async def settle(self, bot: str, update_id: int, attempt: int, settlement: Settlement) -> None:
        statement = queries.settle(
            self.table,
            bot=validate.bot_name(bot),
            update_id=validate.update_id(update_id),
            attempt=validate.attempts("attempt", attempt),
            settlement=check_settlement(settlement),
        )
        await self._changed(statement)

    async def due(
        self,
        *,
        now: int,
        pending_before: int,
        limit: int,
        bots: Sequence[str] | None = None,
    ) -> list[DueUpdate]:
        names = check_bots(bots)
        if names == []:
            return []
        statement = queries.due(
            self.table,
            now=validate.millis("now", now),
            pending_before=validate.millis("pending_before", pending_before),
            limit=validate.positive("limit", limit),
            bots=names,
        )
        async with self._read() as connection:
            rows = (await connection.execute(statement)).all()
        return [
            DueUpdate(row.bot, row.update_id, row.body, row.update_type, row.received_at)
            for row in rows
        ]

    async def prune(self, before: int) -> int:
        """Batches of PRUNE_BATCH rows, each its own transaction, until one comes up short:
        writers (the intake above all) get their turn between batches. One process prunes a
        table at a time: while another one's batch runs, this prune stops where it is (the
        other deletes the rest). Delivered operational events of the same age go with them
        (revision 0004; undelivered ones stay)."""
        before = validate.millis("before", before)
        statement = queries.prune(self.table, before=before, limit=PRUNE_BATCH)
        deleted = 0
        while True:
            async with self.transaction() as connection:
                if not await self._backend.exclusive(connection, self.table, "prune"):
                    return deleted
                batch = await self._backend.delete_recorded(
                    connection, statement, self.attempts_table
                )
            deleted += batch
            if batch < PRUNE_BATCH:
                break
            await asyncio.sleep(0)
        if self.events_table is not None:
            async with self._write() as connection:
                await connection.execute(events.prune(self.events_table, before=before))
        return deleted

    async def refresh_statistics(
        self, *, min_changes: int = 1000, min_age_seconds: float = 10.0
    ) -> bool:
        """The planner's statistics, gathered again once `min_changes` rows were written since the
        last time, at most once every `min_age_seconds` across the cluster (the age is the
        database's) unless the table has since seen more writes than it had rows. A table filled by
        the intake after a quiet period (or from empty) has statistics that say it holds no open
        rows; the claim and settle statements then plan for a handful and read thousands, until
        autovacuum's next analyze, up to a minute and more away. Cheap when nothing is due: one read
        of the database's own counters."""
        validate.positive("min_changes", min_changes)
        if not min_age_seconds >= 0:
            raise ValueError(f"min_age_seconds {min_age_seconds!r} is not a duration")
        async with self._read() as connection:
            age = await self._backend.statistics_age(connection, self.table)
        if age is not None:
            changes, seconds, rows = age
            # A table that has seen more writes than it had rows (gathered while empty, say,
            # as a worker starting before the first burst does) does not wait for the age.
            if changes < min_changes or (seconds < min_age_seconds and changes <= rows):
                return False
        async with self.transaction() as connection:
            if not await self._backend.exclusive(connection, self.table, "analyze"):
                return False
            await self._backend.analyze(connection, self.table)
        return True

    async def reclaim_space(
        self, *, min_dead_rows: int = 1000, scale: float = 0.05, min_age_seconds: float = 10.0
    ) -> bool:
        """The dead rows' space made reusable once enough are dead (autovacuum's own rule:
        `min_dead_rows` plus `scale` times the live rows), at most once every
        `min_age_seconds` across the cluster. The intake inserts, every attempt updates its
        row and prune deletes: without a vacuum the table and its indexes grow by every row
        that ever passed through, whatever the retention. Autovacuum does this where it is on
        and keeps up (its next look can be a minute away, and a server may have it off); this
        does it from the workers, cheap when nothing is due (one read of the counters)."""
        validate.positive("min_dead_rows", min_dead_rows)
        if not (scale >= 0 and min_age_seconds >= 0):
            raise ValueError(f"scale {scale!r} and min_age_seconds {min_age_seconds!r}")
        vacuumed = False
        # The attempt history (revision 0004) churns as the table does: a row per attempt,
        # ended by its settle, deleted by prune.
        for table in (self.table, self.attempts_table):
            if table is None:
                continue
            async with self._read() as connection:
                dead, live, age = await self._backend.dead_rows(connection, table)
            if dead < min_dead_rows + scale * live or (age is not None and age < min_age_seconds):
                continue
            async with self._read() as connection:
                await self._backend.vacuum(connection, table)
                # A vacuum that found the table held by another (SKIP_LOCKED) did nothing:
                # the last vacuum's time tells.
                _, _, after = await self._backend.dead_rows(connection, table)
            vacuumed = vacuumed or (after is not None and (age is None or after < age))
        return vacuumed

    # -- operators' views (beyond docs/contract.md section 4; base level)
    # --------------------------------

    async def get_update(self, bot: str, update_id: int) -> StoredUpdate | None:
        """The row of `(bot, update_id)` as it stands, or None."""
        statement = queries.get_update(
            self.table, bot=validate.bot_name(bot), update_id=validate.update_id(update_id)
        )
        async with self._read() as connection:
            row = (await connection.execute(statement)).first()
        if row is None:
            return None
        fields = row._mapping
        return StoredUpdate(
            **{name: fields.get(name) for name in StoredUpdate.__dataclass_fields__}
        )

    async def stats(self) -> list[BotStats]:
        """Rows by bot and state, in bot order (one scan of the table: an operator's call)."""
        async with self._read() as connection:
            rows = (await connection.execute(queries.stats(self.table))).all()
        durable = "exhausted_at" in self.table.c
        result: list[BotStats] = []
        for bot, group in itertools.groupby(rows, key=lambda row: row.bot):
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
                )
            )
        return result
