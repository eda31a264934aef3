"""What destinations cost the store (docs/design.md decision 7), side by side in one run.

Three shapes of the same bot on each backend, every update with a chat id spread over
Telegram's range (as `bench/intake.lua` sends them):
- `one`: the bot's one downstream (`default`), every update to its row: today's baseline;
- `four, all`: `default` and three more destinations, each taking every update (a row and
  three deliveries per update);
- `four, all, unordered`: the same, the three beside `default` unordered (`ordered = false`,
  as an analytics sink would be): their deliveries keep no queue key;
- `four, disjoint`: four destinations each taking a quarter of the updates (a row
  alone where `default` takes it, an `unrouted` row and one delivery otherwise).
For each: the recording (`add_many`, batches of 50, as the intake's group commit makes them)
in updates/s, then (statistics gathered, as a worker's upkeep does) the drain in
deliveries/s: per destination, batches of 64 claimed in chat order and settled in one
statement, the destinations' claimers running together (as a worker's lanes do). Rounds
alternate the shapes; each ratio is the median of the rounds' own ratios over `one`. The
targets (docs/contract.md section 18): `four, all` at least 0.8x `one`, at the recording and in
deliveries/s.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from app.store import Completed, NewUpdate, SqlUpdateStore, open_store
from app.store.types import TO_DEFAULT, Route
from bench.store import fresh_storage

LEASE = 60_000
DESTINATIONS = ("default", "payments", "moderation", "analytics")
ALL = tuple(Route(name) for name in DESTINATIONS)
UNORDERED = (ALL[0], *(Route(name, ordered=False) for name in DESTINATIONS[1:]))


def _one(update_id: int) -> tuple[Route, ...]:
    return TO_DEFAULT


def _all(update_id: int) -> tuple[Route, ...]:
    return ALL


def _all_unordered(update_id: int) -> tuple[Route, ...]:
    return UNORDERED


def _disjoint(update_id: int) -> tuple[Route, ...]:
    return (ALL[update_id % 4],)


SHAPES: dict[str, Callable[[int], tuple[Route, ...]]] = {
    "one": _one,
    "four, all": _all,
    "four, all, unordered": _all_unordered,
    "four, disjoint": _disjoint,
}


def _updates(count: int, routes: Callable[[int], tuple[Route, ...]]) -> list[NewUpdate]:
    made = []
    for n in range(1, count + 1):
        chat = 100_000_000 + (n % 1_000) * 2_654_435_761 % 7_000_000_000
        body = json.dumps(
            {
                "update_id": n,
                "message": {
                    "message_id": n,
                    "date": 0,
                    "chat": {"id": chat, "type": "private"},
                    "text": "hello, bench",
                },
            }
        )
        made.append(NewUpdate("shop", n, body, 1_000, "message", str(chat), routes=routes(n)))
    return made


async def _record(store: SqlUpdateStore, updates: list[NewUpdate]) -> float:
    started = time.perf_counter()
    for first in range(0, len(updates), 50):
        await store.add_many(updates[first : first + 50])
    return len(updates) / (time.perf_counter() - started)


async def _drain(store: SqlUpdateStore, destinations: tuple[str, ...]) -> float:
    drained = 0
    now = 2_000

    async def lane(destination: str) -> None:
        nonlocal drained
        while True:
            batch = await store.claim_next_owned(
                now=now,
                lease_until=now + LEASE,
                max_attempts=8,
                limit=64,
                ordering="chat",
                destination=destination,
            )
            if not batch:
                return
            await store.settle_many_owned([(c.identity, Completed(now)) for c in batch])
            drained += len(batch)

    started = time.perf_counter()
    await asyncio.gather(*(lane(destination) for destination in destinations))
    return drained / (time.perf_counter() - started)


async def _statistics(store: SqlUpdateStore) -> None:
    """What a worker's upkeep does within seconds of a burst (`refresh_statistics`): the
    planner's statistics of both tables gathered, so that it knows they hold open rows. Asked
    at once, `refresh_statistics` reads PostgreSQL's counters, which a backend flushes up to
    10 s after its commits: a round that asked found none for `one` and drained it on the plan
    of an empty table (1,490 deliveries/s against 9,023 for `four, all`, whose longer
    recording let the counters land). The pause tables it describes itself."""
    await store.refresh_statistics(min_changes=1, min_age_seconds=0)
    async with store.transaction() as connection:
        for table in (store.table, store.deliveries_table):
            if table is not None:
                await store._backend.analyze(connection, table)


async def _round(backend: str, directory: Path, shape: str, count: int) -> tuple[float, float]:
    url, drop = await fresh_storage(backend, directory)
    store = await open_store(url)
    try:
        recorded = await _record(store, _updates(count, SHAPES[shape]))
        await _statistics(store)
        destinations = DESTINATIONS[:1] if shape == "one" else DESTINATIONS
        return recorded, await _drain(store, destinations)
    finally:
        await store.close()
        drop()


async def main(*, quick: bool = False) -> str:
    return await _in_store(quick=quick) + "\n\n" + await _over_http(quick=quick)


async def _in_store(*, quick: bool) -> str:
    """Each shape's recording and drain at the store, and its ratios over `one`'s."""
    count, rounds = (2_000, 1) if quick else (20_000, 3)
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        for backend in ("postgresql", "sqlite"):
            found: dict[str, list[tuple[float, float]]] = {shape: [] for shape in SHAPES}
            for _ in range(rounds):
                for shape in SHAPES:
                    found[shape].append(await _round(backend, Path(directory), shape, count))
            one = found["one"]
            for shape, measured in found.items():
                recorded = statistics.median(r for r, _ in measured)
                drained = statistics.median(d for _, d in measured)
                ratios = [
                    (r / base_r, d / base_d)
                    for (r, d), (base_r, base_d) in zip(measured, one, strict=True)
                ]
                rows.append(
                    f"| {backend} | {shape} | {recorded:,.0f} "
                    f"| {statistics.median(x for x, _ in ratios):.2f} "
                    f"| {drained:,.0f} | {statistics.median(y for _, y in ratios):.2f} |"
                )
    head = (
        f"{count:,} updates a round, {rounds} round(s), {_cores()} cores\n\n"
        "| backend | destinations | recorded updates/s | x one | deliveries/s | x one |\n"
        "| --- | --- | --- | --- | --- | --- |"
    )
    return head + "\n" + "\n".join(rows)


# The intake over HTTP: `serve`'s app (bench/intake_servers.py) with each bot shape, wrk at 64
# connections as `bench intake` runs it; the shapes take turns, round after round.
HTTP_SHAPES = {
    "one": "intake",
    "four, all": "four-all",
    "four, all, unordered": "four-all-unordered",
    "four, disjoint": "four-disjoint",
}


async def _over_http(*, quick: bool) -> str:
    """Each shape's intake rate over HTTP on each backend, and its ratio over `one`'s in the
    same round (the median of the rounds'); every answered update counted in the table."""
    from bench.intake import SPAN, count_stored, measure  # the `bench` extra: wrk, aiogram

    seconds, warm_up, rounds = (2, 1, 1) if quick else (8, 2, 3)
    ids = (n * SPAN for n in itertools.count(1))
    rows = []
    with tempfile.TemporaryDirectory() as directory, contextlib.ExitStack() as drops:
        for backend in ("postgresql", "sqlite"):
            found: dict[str, list[float]] = {shape: [] for shape in HTTP_SHAPES}
            for _ in range(rounds):
                for shape, kind in HTTP_SHAPES.items():
                    url, drop = await fresh_storage(backend, Path(directory))
                    drops.callback(drop)
                    loads = await measure(kind, url, seconds, warm_up, ids)
                    count_stored(url, loads.values())
                    # Every update answered 200 is there; one in flight as wrk stopped may be.
                    wrong = [
                        load
                        for load in loads.values()
                        if load.stored is None or not load.ok <= load.stored <= load.sent
                    ]
                    if wrong:
                        raise RuntimeError(f"{backend}, {shape}: rows lost or extra: {wrong}")
                    found[shape].append(loads[64].rate)
            for shape, rates in found.items():
                ratios = [rate / one for rate, one in zip(rates, found["one"], strict=True)]
                rows.append(
                    f"| {backend} | {shape} | {statistics.median(rates):,.0f} "
                    f"| {statistics.median(ratios):.2f} |"
                )
    return (
        f"The intake over HTTP (wrk, 64 connections, {seconds} s after {warm_up} s, "
        f"{rounds} round(s)), {_cores()} cores\n\n"
        "| backend | destinations | updates/s answered 200 | x one |\n| --- | --- | --- | --- |\n"
        + "\n".join(rows)
    )


def _cores() -> int:
    return os.cpu_count() or 1
