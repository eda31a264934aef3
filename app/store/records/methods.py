"""Recording and keeping the table: add, add_many, prune, and the maintenance that keeps its
statistics fresh and its space reclaimed."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from sqlalchemy import Table

from app.store import validate
from app.store.core import SqlCore
from app.store.events import statements as events
from app.store.records import statements as records
from app.store.types import (
    NewUpdate,
)

PRUNE_BATCH = 2_000  # rows a prune deletes per transaction


class RecordMethods(SqlCore):
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
        stored, deliveries = self._recordable(rows)
        with self._writing():
            added = await self._backend.add_many(stored, deliveries)
        assert added is not None  # no guard
        return {(row.bot, row.update_id) for row in added}

    async def prune(self, before: int) -> int:
        """Delete the updates done before `before`: the row's delivery and every other one
        (revision 0010) settled before it, an open exhaustion never (docs/contract.md).
        Batches of PRUNE_BATCH rows, each its own transaction, until one comes up short:
        writers (the intake above all) get their turn between batches. One process prunes a
        table at a time: while another one's batch runs, this prune stops where it is (the
        other deletes the rest). Delivered operational events of the same age go with them
        (revision 0004; undelivered ones stay)."""
        before = validate.millis("before", before)
        deliveries = self.deliveries_table
        routed = deliveries is not None
        if deliveries is not None and not await self._holds_rows(deliveries):
            # No update has a delivery beside its row (the common case: one downstream), and
            # none recorded from now on is prunable: the batches need not look for them.
            deliveries = None
        statement = records.prune(
            self.table, deliveries, before=before, limit=PRUNE_BATCH, unrouted=routed
        )
        kept = [self.attempts_table]
        if deliveries is not None:
            kept += [deliveries, self.delivery_attempts_table]
        beside = [table for table in kept if table is not None]
        deleted = 0
        while True:
            async with self.transaction() as connection:
                if not await self._backend.exclusive(connection, self.table, "prune"):
                    return deleted
                batch = await self._backend.delete_recorded(connection, statement, beside)
            deleted += batch
            if batch < PRUNE_BATCH:
                break
            await asyncio.sleep(0)
        if self.events_table is not None:
            async with self._write() as connection:
                await connection.execute(events.prune(self.events_table, before=before))
        return deleted

    async def _holds_rows(self, table: Table) -> bool:
        async with self._read() as connection:
            return (await connection.execute(records.any_row(table))).first() is not None

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
