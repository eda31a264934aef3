"""The planner's statistics of the tables the claims and settles read: gathered when a burst
made them wrong, never from an empty table (docs/store.md, docs/performance.md). Upkeep that
every family may ask for (an exhaustion's bulk action does), composed into `SqlCore` as
`Sealing` is."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager

from sqlalchemy import Table
from sqlalchemy.ext.asyncio import AsyncConnection

from app.store import validate
from app.store.backend import Backend


class PlannerStatistics:
    """`refresh_statistics`, on what `SqlCore` provides: its tables, backend and transactions."""

    table: Table
    deliveries_table: Table | None
    bots_table: Table | None
    destinations_table: Table | None
    _backend: Backend

    def _read(self) -> AbstractAsyncContextManager[AsyncConnection]:
        raise NotImplementedError  # SqlCore's

    def transaction(self) -> AbstractAsyncContextManager[AsyncConnection]:
        raise NotImplementedError  # SqlCore's

    async def refresh_statistics(
        self, *, min_changes: int = 1000, min_age_seconds: float = 10.0
    ) -> bool:
        """The planner's statistics, gathered again once `min_changes` rows were written since the
        last time (or ever), at most once every `min_age_seconds` across the cluster (the age is
        the database's) unless the table has since seen more writes than it had rows. A table
        filled by the intake after a quiet period (or from empty) has statistics that say it holds
        no open rows; the claim and settle statements then plan for a handful and read thousands,
        until autovacuum's next analyze, up to a minute and more away. Cheap when nothing is due:
        one read of the database's own counters.

        Never from a table that holds no rows: statistics gathered from an empty table say that
        each of its indexes has no entries, however far it grows, where none at all let the
        planner scale each index by its size. Workers starting on an empty table gathered them
        so, and four of them then drained a burst at a quarter of their pace (docs/store.md)."""
        validate.positive("min_changes", min_changes)
        if not min_age_seconds >= 0:
            raise ValueError(f"min_age_seconds {min_age_seconds!r} is not a duration")
        gathered = False
        # The deliveries beside the rows (revision 0010) churn as the rows do: their claims
        # plan by their statistics as the rows' claims by the table's.
        for table in (self.table, self.deliveries_table):
            if table is not None:
                gathered = await self._refresh(table, min_changes, min_age_seconds) or gathered
        await self._describe_pauses(min_age_seconds)
        return gathered

    async def _describe_pauses(self, min_age_seconds: float) -> None:
        """Statistics of the tables every claim asks whether a bot or a destination is paused
        (`_bots`, `_destinations`), gathered when they never were or have changed since, empty
        or not (not counted in `refresh_statistics`' answer). Never gathered, a table is taken
        for ten pages of rows: the planner then expected a claim's pause checks to keep 80 of
        20,000 deliveries, read all of them to join the batch, and drained an unordered
        destination at 0.4x the pace it drains with them (docs/performance.md). Autovacuum
        never gathers them: they see a handful of writes in their life."""
        for table in (self.bots_table, self.destinations_table):
            if table is None:
                continue
            async with self._read() as connection:
                age = await self._backend.statistics_age(connection, table)
            if age.seconds is not None and (age.changes == 0 or age.seconds < min_age_seconds):
                continue
            async with self.transaction() as connection:
                if await self._backend.exclusive(connection, table, "analyze"):
                    await self._backend.analyze(connection, table)

    async def _refresh(self, table: Table, min_changes: int, min_age_seconds: float) -> bool:
        async with self._read() as connection:
            age = await self._backend.statistics_age(connection, table)
        if age.changes < min_changes or age.live == 0:
            return False
        # A table that has seen more writes than it had rows (a burst into a small table, say)
        # does not wait for the age.
        if age.seconds is not None and age.seconds < min_age_seconds and age.changes <= age.rows:
            return False
        async with self.transaction() as connection:
            if not await self._backend.exclusive(connection, table, "analyze"):
                return False
            await self._backend.analyze(connection, table)
        return True
