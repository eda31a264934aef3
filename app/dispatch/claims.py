"""The claim loop: claim due deliveries in batches per lane (a destination of a bot), start an
attempt for each, sleep.

One loop per process takes batches with `claim_next_owned` (per-chat ordering is the
database's: only the oldest non-terminal row of a chat is eligible), within a limit per
process and per bot, turning through the lanes so none starves. A bot whose breaker is open
is passed over. A plain bot lists its due rows and claims them one by one with the base
methods. The loop sleeps until woken: by `wake` (new rows, from the intake in this process or
a PostgreSQL NOTIFY from one elsewhere), by a retry falling due, by an attempt ending (which
may unblock its chat), or by the poll interval.

Each claimed row becomes an `Attempt` run as a task by the `AttemptRunner`; its end is
counted, by bot and outcome, as the task finishes. The limits (`worker_concurrency` per
process, `concurrency` per bot) count requests to the downstreams in flight, as a job queue's
concurrency counts its handlers running: an attempt whose answer has come frees its place
while its batched settle commits, so the next claim need not wait for that settle. The
attempts still settling are bounded too, by the process's limit again: a slow database
slows the claims rather than piling settles up. The order of a chat does not depend on it:
its next update is claimable only once the settle has committed.

Operator control: a paused bot's claims take nothing (the claim statement itself checks the
pause, so it binds at once, in every process). A bot with a rate limit takes its tokens from
the bucket every process shares before it claims, and gives back what the claim did not use:
a throttled update is never claimed, so it spends no attempt. Which bots have a limit is read
once a second (`CONTROLS_SECONDS`); the breaker's transitions are reported to the bot's row.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

from app import tracing
from app.dispatch.attempt import Attempt, ClaimSpan, Lane
from app.dispatch.clock import DatabaseClock, wait_or_timeout
from app.dispatch.runner import AttemptRunner
from app.logs import AttemptLog
from app.store import Claimed, ClaimIdentity, OperatorStore, SchemaError, StoreError
from app.store.storage import failure_level
from app.store.types import DEFAULT_DESTINATION

log = logging.getLogger(__name__)
CONTROLS_SECONDS = 1.0  # how often the loop reads which bots have a rate limit
THROTTLED_SECONDS = 0.05  # the least a throttled bot waits for tokens: not a claim per token
STALLED_LOOK_SECONDS = 0.1  # how often claims look again while settles are stalled

# A plain bot's attempts have no claim_id (revision 0001); this stands in, never sent or stored.
PLAIN_CLAIM = "(plain)"


class ClaimLoop:
    """Claims for `lanes` while at most `capacity` requests are in flight (and as many
    attempts settling), `batch` rows a statement, and starts each attempt with `runner`.
    `wake` is its doorbell."""

    def __init__(
        self,
        store: OperatorStore,
        clock: DatabaseClock,
        lanes: Sequence[Lane],
        runner: AttemptRunner,
        *,
        wake: asyncio.Event,
        capacity: int,
        batch: int,
        poll_seconds: float,
        beat: Callable[[], None] = lambda: None,
    ) -> None:
        self._store = store
        self._clock = clock
        self._lanes = list(lanes)
        self._runner = runner
        self._wake = wake
        self._capacity = capacity
        self._batch = batch
        self._poll = poll_seconds
        self._beat = beat  # once a turn, for the worker's health
        # Saturated, claim again only once a quarter batch is free: not one row per statement.
        self._refill = max(1, min(batch, capacity) // 4)
        self.attempts: set[Attempt] = set()  # claimed and not yet ended: forwarding or settling
        self.in_flight = 0  # of those, the ones whose request has not ended
        self.passes = 0  # turns that looked at every lane without failing: chances to claim
        self._stopping = False
        self._controls_read = -CONTROLS_SECONDS  # monotonic seconds; -: never yet
        self._controls = True  # the table has revision 0004's controls
        self._timed = tracing.tracer() is not None  # each claim's time, for the attempts' spans

    async def _read_controls(self) -> None:
        """Which lanes (bots, and their destinations) have a rate limit, once a second: a new
        limit binds within about that."""
        now = time.monotonic()
        if not self._controls or now - self._controls_read < CONTROLS_SECONDS:
            return
        self._controls_read = now
        try:
            controls = await self._store.bot_controls([lane.name for lane in self._lanes])
        except SchemaError:
            self._controls = False  # a table below 0004: plain bots only, nothing to read
            return
        if any(lane.destination != DEFAULT_DESTINATION for lane in self._lanes):
            names = sorted({lane.name for lane in self._lanes})
            controls += await self._store.bot_controls(names, destinations=True)
        rates = {(c.bot, c.destination): c.rate_per_second for c in controls}
        for lane in self._lanes:
            lane.rate_per_second = rates.get((lane.name, lane.destination))

    def stop(self) -> None:
        """Claim no more; `run` returns."""
        self._stopping = True
        self._wake.set()

    async def run(self) -> None:
        rotation = 0
        pause = 0.0
        while not self._stopping:
            self._beat()
            self._wake.clear()
            try:
                await self._read_controls()
            except StoreError as error:
                log.log(failure_level(error), "reading the bots' controls failed: %s", error)
            if self._free() < self._refill:
                await wait_or_timeout(self._wake, self._poll)
                continue
            if self._runner.stalled:
                # Settles wait for a database that cannot write: theirs land first, before a
                # claim here retakes an update whose lease lapsed meanwhile (`app.dispatch.runner`).
                await asyncio.sleep(STALLED_LOOK_SECONDS)
                continue
            more = False
            failed = False
            lanes = self._lanes[rotation:] + self._lanes[:rotation]
            rotation = (rotation + 1) % max(1, len(self._lanes))
            for lane in lanes:
                free = min(self._free(), lane.options.concurrency - lane.in_flight)
                lane.saturated = free <= 0
                wanted = lane.breaker.allowance(min(free, self._batch))
                if wanted <= 0 or self._stopping:
                    continue
                try:
                    started = await self._claim(lane, wanted)
                except StoreError as error:
                    log.log(failure_level(error), "claim for %r failed: %s", lane.label, error)
                    failed = True
                    continue
                except Exception:  # a bug must not end the claim loop of a process
                    log.exception("claim for %r failed", lane.label)
                    failed = True
                    continue
                lane.saturated = started == wanted
                more = more or lane.saturated
            if failed:
                # The database is down or struggling: back off instead of spinning on wakes.
                pause = min(max(pause * 2, 0.05), self._poll)
                await asyncio.sleep(pause)
                continue
            pause = 0.0
            self.passes += 1
            if not more:
                await wait_or_timeout(self._wake, self._idle_seconds())

    def start(
        self,
        lane: Lane,
        claimed: Claimed,
        lease_until: int,
        now: int,
        *,
        probe: bool,
        claim: ClaimSpan | None = None,
    ) -> Attempt:
        """Run the attempt of a row just claimed (`claim`: when its claim ran, with tracing
        on), counting it in flight until it ends."""
        attempt = Attempt(lane, claimed, lease_until, now, probe=probe, claim=claim)
        lane.in_flight += 1
        self.in_flight += 1
        self.attempts.add(attempt)
        if log.isEnabledFor(logging.DEBUG):
            AttemptLog.of(log, attempt.identity).debug("claimed, lease until %d", lease_until)
        attempt.task = asyncio.create_task(self._runner.run(attempt, self._forwarded))
        # In a callback, not in run: a task cancelled before its first step never runs it.
        attempt.task.add_done_callback(lambda _: self._finished(attempt))
        return attempt

    def _idle_seconds(self) -> float:
        probes = [lane.breaker.seconds_until_probe() for lane in self._lanes]
        tokens = [
            1 / lane.rate_per_second
            for lane in self._lanes
            if lane.throttled and lane.rate_per_second
        ]
        return min([self._poll, *(seconds for seconds in probes if seconds is not None), *tokens])

    async def _claim(self, lane: Lane, wanted: int) -> int:
        now = self._clock.now()
        lane.throttled = False
        if lane.rate_per_second is None:
            return await self._claim_now(lane, wanted, now)
        granted = await self._store.take_tokens(
            lane.name, wanted, now=now, destination=lane.destination
        )
        lane.throttled = granted < wanted
        if granted == 0:
            return 0
        started = 0
        try:
            started = await self._claim_now(lane, granted, now)
        finally:
            if started < granted:
                await self._store.return_tokens(
                    lane.name, granted - started, destination=lane.destination
                )
        return started

    async def _claim_now(self, lane: Lane, wanted: int, now: int) -> int:
        lease_until = now + lane.lease_ms
        if lane.plain:
            return await self._claim_plain(lane, wanted, now, lease_until)
        started_ns = time.time_ns() if self._timed else 0
        claimed = await self._store.claim_next_owned(
            now=now,
            lease_until=lease_until,
            max_attempts=lane.options.max_attempts,
            limit=wanted,
            ordering=lane.ordering,
            bots=[lane.name],
            durable_exhaustion=lane.durable,
            destination=lane.destination,
        )
        claim = ClaimSpan(started_ns, time.time_ns(), len(claimed)) if self._timed else None
        probe = lane.breaker.started(len(claimed))
        for row in claimed:
            self.start(lane, row, lease_until, now, probe=probe, claim=claim)
        return len(claimed)

    async def _claim_plain(self, lane: Lane, wanted: int, now: int, lease_until: int) -> int:
        """A plain bot on the base methods: list its due rows, then claim them one by one (a
        rival may take any of them first; the claim's condition settles who). The base
        methods know no chats, so a plain bot's ordering is "none" (see BotSettings)."""
        due = await self._store.due(now=now, pending_before=now, limit=wanted, bots=[lane.name])
        started = 0
        for row in due:
            started_ns = time.time_ns() if self._timed else 0
            attempt = await self._store.claim(
                row.bot,
                row.update_id,
                now=now,
                lease_until=lease_until,
                max_attempts=lane.options.max_attempts,
            )
            if attempt is not None:
                identity = ClaimIdentity(row.bot, row.update_id, attempt, PLAIN_CLAIM)
                received_at = now if row.received_at is None else row.received_at
                # The base claim reports no budget: a plain bot's attempts all count.
                claimed = Claimed(
                    identity,
                    row.body,
                    row.update_type,
                    None,
                    received_at,
                    attempt,
                    unreadable=row.unreadable,
                )
                claim = ClaimSpan(started_ns, time.time_ns(), 1) if self._timed else None
                probe = lane.breaker.started(1)
                self.start(lane, claimed, lease_until, now, probe=probe, claim=claim)
                started += 1
        return started

    def _free(self) -> int:
        """How many more attempts may start: requests in flight and attempts settling, each
        within the process's limit."""
        return min(self._capacity - self.in_flight, 2 * self._capacity - len(self.attempts))

    def _forwarded(self, attempt: Attempt) -> None:
        """Its request ended: it leaves the limits of requests in flight (once)."""
        if not attempt.forwarding:
            return
        attempt.forwarding = False
        lane = attempt.lane
        lane.in_flight -= 1
        self.in_flight -= 1
        if self._room_opened(lane):
            self._wake.set()

    def _room_opened(self, lane: Lane) -> bool:
        """Whether a place just freed can let the claim loop take more: `lane` had more due,
        or the places free reached the quarter batch the loop waits for."""
        return lane.saturated or self._free() == self._refill

    def _finished(self, attempt: Attempt) -> None:
        lane = attempt.lane
        lane.meters.attempts["lost" if attempt.lost else attempt.outcome].inc()
        self._forwarded(attempt)  # a task cancelled or failed before its request ended
        self.attempts.discard(attempt)
        if attempt.probe and not attempt.judged:
            lane.breaker.probe_ended_unjudged()
            attempt.unblocks = True
        # Look again only when this end can make something claimable: a waiting update of
        # its chat, capacity the claim loop waits for, or a bot that had more due. Otherwise
        # new rows wake the loop themselves, and a poll catches the rest.
        if attempt.unblocks or self._room_opened(lane):
            self._wake.set()
