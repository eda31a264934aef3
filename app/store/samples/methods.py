"""The console's minute samples (revision 0011, docs/design.md decision 8): counts added by every
process, the backlog sampled by one a minute, a window read by the primary key."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Table, literal

from app.store import validate
from app.store.core import SqlCore
from app.store.operator_types import MinuteCounts, Sample
from app.store.samples import statements as samples
from app.store.schema_samples import SAMPLE_COUNTS
from app.store.types import DEFAULT_DESTINATION

MINUTE_MS = 60_000
_COUNTS = frozenset(SAMPLE_COUNTS)


class SampleMethods(SqlCore):
    def _samples(self, feature: str) -> Table:
        return self._needing(self.samples_table, feature, "0011")

    async def add_samples(self, counts: Sequence[MinuteCounts]) -> None:
        table = self._samples("add_samples")
        rows = [_row(item) for item in counts]
        if not rows:
            return
        async with self._write() as connection:
            await connection.execute(samples.add(table, self._backend.upsert, rows))

    async def sample_backlog(self, minute: int, *, now: int) -> bool:
        table = self._samples("sample_backlog")
        minute, now = _minute(minute), validate.millis("now", now)
        upsert = self._backend.upsert
        async with self.transaction() as connection:
            taken = await connection.execute(samples.take_minute(table, upsert, minute))
            if taken.first() is None:
                return False
            found = list(
                await connection.execute(samples.backlog(self.table, literal(DEFAULT_DESTINATION)))
            )
            if self.deliveries_table is not None:
                deliveries = self.deliveries_table
                statement = samples.backlog(deliveries, deliveries.c.destination)
                found += list(await connection.execute(statement))
            rows = [
                {
                    "bot": row.bot,
                    "destination": row.destination,
                    "minute": minute,
                    "backlog": int(row.backlog),
                    "oldest_age_ms": max(0, now - int(row.oldest)),
                }
                for row in found
            ]
            if rows:
                await connection.execute(samples.set_backlog(table, upsert, rows))
        return True

    async def samples(
        self,
        bots: Sequence[str],
        *,
        since: int,
        until: int,
        destinations: Sequence[str] | None = None,
    ) -> list[Sample]:
        table = self._samples("samples")
        names = sorted({validate.bot_name(bot) for bot in bots})
        since, until = validate.millis("since", since), validate.millis("until", until)
        if destinations is not None:
            destinations = sorted({validate.destination_name(d) for d in destinations})
        if not names or since >= until:
            return []
        statement = samples.window(
            table, bots=names, since=since, until=until, destinations=destinations
        )
        async with self._read() as connection:
            rows = (await connection.execute(statement)).all()
        return [
            Sample(
                row.bot,
                row.destination,
                int(row.minute),
                {name: int(getattr(row, name)) for name in SAMPLE_COUNTS},
                None if row.backlog is None else int(row.backlog),
                None if row.oldest_age_ms is None else int(row.oldest_age_ms),
            )
            for row in rows
        ]

    async def prune_samples(self, before: int) -> int:
        table = self._samples("prune_samples")
        before = validate.millis("before", before)
        async with self._write() as connection:
            return int((await connection.execute(samples.prune(table, before))).rowcount)


def _minute(minute: int) -> int:
    minute = validate.millis("minute", minute)
    if minute % MINUTE_MS:
        raise ValueError(f"minute {minute!r} is not the start of a minute (epoch ms)")
    return minute


def _row(item: MinuteCounts) -> dict[str, Any]:
    unknown = set(item.counts) - _COUNTS
    if unknown:
        raise ValueError(f"no such counts: {sorted(unknown)}")
    if any(not isinstance(n, int) or isinstance(n, bool) or n < 0 for n in item.counts.values()):
        raise ValueError(f"counts must be whole numbers from 0: {dict(item.counts)}")
    return {
        "bot": validate.bot_name(item.bot),
        "destination": validate.destination_name(item.destination),
        "minute": _minute(item.minute),
        **{name: item.counts.get(name, 0) for name in SAMPLE_COUNTS},
    }
