"""What this process counts for the console's charts, and its once-a-minute flush into the samples
(docs/design.md decision 8).

The intake counts each update it records, per destination it goes to; a worker counts each
forward's answer, each delivery (a 2xx settled) with its time since receipt, each retry settled
and each update ended without delivery. Counting is a dictionary increment. `flush_forever`
adds the counts, once a minute, to their minutes' rows (`Samples.add_samples`), and in a worker
process samples the backlog of the minute when no other process has (`sample_backlog`). A
flush that fails keeps its counts for the next one; a process killed between two flushes loses
at most a minute of its own counts (the rows stay the truth).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
from collections import Counter
from collections.abc import Callable, Iterable

from app.metric_labels import ForwardAnswer
from app.store import SchemaError, StoreError
from app.store.operator_types import MinuteCounts
from app.store.samples.roles import Samples
from app.store.schema_samples import SAMPLE_BUCKETS_MS
from app.store.storage import failure_level

log = logging.getLogger(__name__)

MINUTE_MS = 60_000
# Where each answer counts in a sample (`schema_beside.SAMPLE_COUNTS`).
ANSWER_COUNTS: dict[ForwardAnswer, str] = {
    "2xx": "answered_2xx",
    "3xx": "answered_3xx",
    "4xx": "answered_4xx",
    "5xx": "answered_5xx",
    "timeout": "timeouts",
    "connection_error": "connection_errors",
    "other": "answered_other",
}
_BUCKETS = [f"within_{ms}" for ms in SAMPLE_BUCKETS_MS]

Key = tuple[str, str, int]  # bot, destination, minute


class Tally:
    """This process's counts per bot, destination and minute, until `take`n."""

    def __init__(self) -> None:
        self._counts: dict[Key, Counter[str]] = {}

    def count(self, bot: str, destination: str, at: int, name: str) -> None:
        """One more `name` for `bot`'s `destination` in the minute of `at` (epoch ms)."""
        key = (bot, destination, at - at % MINUTE_MS)
        counts = self._counts.get(key)
        if counts is None:
            counts = self._counts[key] = Counter()
        counts[name] += 1

    def received(self, bot: str, destinations: Iterable[str], at: int) -> None:
        for destination in destinations:
            self.count(bot, destination, at, "received")

    def delivered(self, bot: str, destination: str, at: int, since_receipt_ms: int) -> None:
        """A delivery at `at`, `since_receipt_ms` after its update was received."""
        self.count(bot, destination, at, "delivered")
        bucket = bisect.bisect_left(SAMPLE_BUCKETS_MS, since_receipt_ms)
        self.count(bot, destination, at, _BUCKETS[bucket] if bucket < len(_BUCKETS) else "over")

    def take(self) -> list[MinuteCounts]:
        """Everything counted so far, which the tally forgets."""
        counts, self._counts = self._counts, {}
        return [
            MinuteCounts(bot, destination, minute, dict(found))
            for (bot, destination, minute), found in counts.items()
        ]

    def give_back(self, taken: Iterable[MinuteCounts]) -> None:
        """Counts a flush could not write, kept for the next one."""
        for item in taken:
            key = (item.bot, item.destination, item.minute)
            self._counts.setdefault(key, Counter()).update(item.counts)


async def flush(store: Samples, tally: Tally) -> None:
    """Add what `tally` holds to the samples; on a store error keep it, and raise."""
    taken = tally.take()
    if not taken:
        return
    try:
        await store.add_samples(taken)
    except BaseException:
        tally.give_back(taken)
        raise


async def flush_forever(
    store: Samples, tally: Tally, now: Callable[[], int], *, backlog: bool
) -> None:
    """Flush once a minute, just past its turn (by `now`, the database's clock); with
    `backlog`, sample the minute's backlog when no other process has. Until cancelled, when it
    flushes once more. A table below revision 0011 ends it, with one line."""
    try:
        while True:
            at = now()
            await asyncio.sleep((MINUTE_MS - at % MINUTE_MS + 1_000) / 1000)
            try:
                await flush(store, tally)
                if backlog:
                    at = now()
                    await store.sample_backlog(at - at % MINUTE_MS, now=at)
            except SchemaError as error:
                log.warning("the console's charts get no samples: %s", error)
                return
            except StoreError as error:
                log.log(failure_level(error), "samples kept for the next minute: %s", error)
            except Exception:  # a bug must not end the charts' counts for the process's life
                log.exception("flushing the console's samples failed")
    finally:
        with contextlib.suppress(StoreError, asyncio.CancelledError):
            await asyncio.shield(flush(store, tally))
