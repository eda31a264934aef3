"""Long polling (revision 0004, docs/contract.md section 11): the poller's lease, and recording a
polled batch with the offset that confirms it, in one transaction under that lease."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Table

from app.store import validate
from app.store.checks import check_lease
from app.store.core import SqlCore
from app.store.polling import statements as polling
from app.store.types import NewUpdate


class PollingMethods(SqlCore):
    def _poll_table(self, feature: str) -> Table:
        return self._needing(self.bots_table, feature, "0004")

    async def take_poller(self, bot: str, *, holder: str, now: int, lease_until: int) -> int | None:
        """Take (or, as its holder, renew) the lease of `bot`'s one poller across every
        process until `lease_until`: the offset to ask getUpdates for (0: none yet) to the
        caller that holds it, None to any other while the lease holds."""
        table = self._poll_table("take_poller")
        now, lease_until = check_lease(now, lease_until)
        statement = polling.take(
            table,
            self._backend.upsert,
            bot=validate.bot_name(bot),
            holder=validate.text("holder", holder),
            now=now,
            lease_until=lease_until,
        )
        async with self._write() as connection:
            row = (await connection.execute(statement)).first()
        return None if row is None else int(row.poll_offset or 0)

    async def record_polled(
        self, bot: str, rows: Sequence[NewUpdate], *, holder: str, now: int, offset: int
    ) -> set[tuple[str, int]] | None:
        """Record a polled batch of `bot` (as `add_many`: duplicates change nothing) and move
        its offset to `offset`, in one transaction, only while `holder` holds the poller's
        lease: the keys that were new, or None (nothing recorded) when the lease was lost."""
        table = self._poll_table("record_polled")
        bot, now = validate.bot_name(bot), validate.millis("now", now)
        offset = validate.update_id(offset)
        for row in rows:
            if not isinstance(row, NewUpdate) or row.bot != bot:
                raise ValueError(f"row {row!r} is not a NewUpdate of bot {bot!r}")
        statement = polling.advance(table, bot=bot, holder=holder, now=now, offset=offset)
        stored, deliveries = self._recordable(rows)
        with self._writing():
            added = await self._backend.add_many(stored, deliveries, guard=statement)
        return None if added is None else {(row.bot, row.update_id) for row in added}

    async def release_poller(self, bot: str, *, holder: str) -> bool:
        """Give up the lease (a stopping process), so another takes over at once."""
        table = self._poll_table("release_poller")
        statement = polling.release(table, bot=validate.bot_name(bot), holder=holder)
        return await self._changed(statement)
