"""The dispatcher: claim due updates, forward each attempt, keep its lease, settle it fenced.

One claim loop per process takes batches with `claim_next_owned` (per-chat ordering is the
database's: only the oldest non-terminal row of a chat is eligible), within a limit per
process and per bot. It sleeps until woken: by the intake in this process, by a PostgreSQL
NOTIFY from an intake elsewhere, by a retry falling due, by an attempt ending (which may
unblock its chat), or by the poll interval. Every comparison with a lease uses the database's
clock (`DatabaseClock`).

Each attempt is a task. The lease keeper renews its lease every lease/3 while the request
runs; a refused renewal, or the last proven lease running out, is the owner-lost signal: the
request is cancelled, nothing is settled, and a late answer is ignored. A fenced settle that
returns False also means the claim was lost, never success. On `stop`, claiming ends, attempts
get `shutdown_grace_seconds` to finish, and the rest are handed back with a fenced settle that
makes them due at once, so another process retakes them.

Every attempt is counted once as it ends, by bot and outcome (`app.metrics`), with the
duration of its downstream request, its lease renewals and owner-lost events.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import httpx

from app.config import BotSettings, Settings
from app.dispatch.attempt import Attempt, Lane
from app.dispatch.clock import Alarm, DatabaseClock, wait_or_timeout
from app.dispatch.leases import LeaseKeeper
from app.dispatch.maintenance import ExhaustionDelivery, prune_forever
from app.dispatch.settler import Settler
from app.logs import AttemptLog
from app.metrics import AttemptOutcome, LostReason, Metrics
from app.policy import Outcome, retry_delay_ms
from app.store import (
    Abandoned,
    Claimed,
    ClaimIdentity,
    Completed,
    DurableUpdateStore,
    Failed,
    Settlement,
    StoreError,
    StoreUnavailable,
)

log = logging.getLogger(__name__)
Result = TypeVar("Result")

# A plain bot's attempts have no claim_id (revision 0001); this stands in, never sent or stored.
PLAIN_CLAIM = "(plain)"
EXPIRED = "expired"
HANDED_BACK = "handed back: the worker was shutting down"
LOST_BECAUSE: dict[LostReason, str] = {
    "renewal_refused": "renewal refused",
    "lease_ran_out": "its lease ran out unrenewed",
    "settle_refused": "settle refused",
    "exhaust_refused": "exhaust refused",
}


class Dispatcher:
    """The workers of one process, for the bots given (default: every bot of `settings`)."""

    def __init__(
        self,
        store: DurableUpdateStore,
        settings: Settings,
        transport: httpx.AsyncBaseTransport,
        *,
        bots: Sequence[BotSettings] | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self._store = store
        self._settings = settings
        chosen = settings.bots if bots is None else bots
        metrics = metrics or Metrics.of(settings)
        self._lanes = [Lane(bot, transport, metrics.dispatch(bot.name)) for bot in chosen]
        self._clock = DatabaseClock(store)
        self._settler = Settler(store)
        self._capacity = settings.worker_concurrency
        self._batch = settings.claim_batch
        # Saturated, claim again only once a quarter batch is free: not one row per statement.
        self._refill = max(1, min(self._batch, self._capacity) // 4)
        self._tick = min(1.0, min((lane.lease_ms for lane in self._lanes), default=6000) / 6000)
        self._attempts: set[Attempt] = set()
        self._in_flight = 0
        self._wake = asyncio.Event()
        self._arrivals = 0  # wake-ups for new rows so far (see _settle)
        self._retries = Alarm(self._clock, self._wake.set)  # a wake-up as each retry falls due
        self.listening = asyncio.Event()  # set once NOTIFY wake-ups arrive (PostgreSQL)
        self._stopping = False
        self._background: list[asyncio.Task[None]] = []
        self._claim_loop: asyncio.Task[None] | None = None
        self.owner_lost = 0  # attempts that found their claim taken or lapsed
        exhaustion_targets = {
            lane.name: lane.downstream
            for lane in self._lanes
            if lane.durable and lane.bot.exhaustion_url is not None
        }
        self._exhaustions = (
            ExhaustionDelivery(
                store,
                self._clock,
                exhaustion_targets,
                retry_seconds=settings.exhaustion_retry_seconds,
                meters={lane.name: lane.meters for lane in self._lanes},
            )
            if exhaustion_targets
            else None
        )

    @property
    def clock(self) -> DatabaseClock:
        return self._clock

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def wake(self) -> None:
        """New updates are due: look now instead of at the next poll."""
        self._arrivals += 1
        self._wake.set()

    async def start(self) -> None:
        for lane in self._lanes:
            self._store.require(lane.bot.capability, lane.bot.needs)
        await self._clock.sync()
        await self._settler.start()
        settings = self._settings
        keeper = LeaseKeeper(
            self._store, self._clock.now, self._attempts, self._lost, tick=self._tick
        )
        background = [
            keeper.run(),
            self._clock.run(),
            self._store.listen(self.wake, listening=self.listening),
            prune_forever(
                self._store,
                self._clock,
                retention_ms=int(settings.retention_seconds * 1000),
                interval=settings.prune_interval_seconds,
            ),
        ]
        if self._exhaustions is not None:
            background.append(self._exhaustions.run())
        self._background = [asyncio.create_task(job) for job in background]
        self._claim_loop = asyncio.create_task(self._claim_forever())
        for task in [*self._background, self._claim_loop]:
            task.add_done_callback(_report_exit)

    async def stop(self) -> None:
        """Stop claiming, give attempts the grace period, hand the rest back, stop."""
        self._stopping = True
        self._wake.set()
        if self._claim_loop is not None:
            await asyncio.gather(self._claim_loop, return_exceptions=True)
        tasks = [attempt.task for attempt in self._attempts if attempt.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=self._settings.shutdown_grace_seconds)
        handed_back = [a for a in self._attempts if a.forwarding and a.task is not None]
        for attempt in handed_back:
            attempt.handed_back = True
            assert attempt.task is not None
            attempt.task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._settler.stop()
        if handed_back:
            with contextlib.suppress(StoreError):
                await self._store.announce()  # other processes take them over at once
        self._retries.cancel()
        for job in self._background:
            job.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)

    # -- claiming ------------------------------------------------------------------------------

    async def _claim_forever(self) -> None:
        rotation = 0
        pause = 0.0
        while not self._stopping:
            self._wake.clear()
            if self._capacity - self._in_flight < self._refill:
                await wait_or_timeout(self._wake, self._settings.poll_interval_seconds)
                continue
            more = False
            failed = False
            lanes = self._lanes[rotation:] + self._lanes[:rotation]
            rotation = (rotation + 1) % max(1, len(self._lanes))
            for lane in lanes:
                free = min(self._capacity - self._in_flight, lane.bot.concurrency - lane.in_flight)
                lane.saturated = free <= 0
                wanted = lane.breaker.allowance(min(free, self._batch))
                if wanted <= 0 or self._stopping:
                    continue
                try:
                    started = await self._claim(lane, wanted)
                except StoreError as error:
                    log.warning("claim for bot %r failed: %s", lane.name, error)
                    failed = True
                    continue
                except Exception:  # a bug must not end the claim loop of a process
                    log.exception("claim for bot %r failed", lane.name)
                    failed = True
                    continue
                lane.saturated = started == wanted
                more = more or lane.saturated
            if failed:
                # The database is down or struggling: back off instead of spinning on wakes.
                pause = min(max(pause * 2, 0.05), self._settings.poll_interval_seconds)
                await asyncio.sleep(pause)
                continue
            pause = 0.0
            if not more:
                await wait_or_timeout(self._wake, self._idle_seconds())

    def _idle_seconds(self) -> float:
        poll = self._settings.poll_interval_seconds
        probes = [lane.breaker.seconds_until_probe() for lane in self._lanes]
        return min([poll, *(seconds for seconds in probes if seconds is not None)])

    async def _claim(self, lane: Lane, wanted: int) -> int:
        now = self._clock.now()
        lease_until = now + lane.lease_ms
        if lane.plain:
            return await self._claim_plain(lane, wanted, now, lease_until)
        claimed = await self._store.claim_next_owned(
            now=now,
            lease_until=lease_until,
            max_attempts=lane.bot.max_attempts,
            limit=wanted,
            ordering=lane.bot.ordering,
            bots=[lane.name],
            durable_exhaustion=lane.durable,
        )
        probe = lane.breaker.started(len(claimed))
        for row in claimed:
            self._start(lane, row, lease_until, now).probe = probe
        return len(claimed)

    async def _claim_plain(self, lane: Lane, wanted: int, now: int, lease_until: int) -> int:
        """A plain bot on the base methods: list its due rows, then claim them one by one (a
        rival may take any of them first; the claim's condition settles who). The base
        methods know no chats, so a plain bot's ordering is "none" (see BotSettings)."""
        due = await self._store.due(now=now, pending_before=now, limit=wanted, bots=[lane.name])
        started = 0
        for row in due:
            attempt = await self._store.claim(
                row.bot,
                row.update_id,
                now=now,
                lease_until=lease_until,
                max_attempts=lane.bot.max_attempts,
            )
            if attempt is not None:
                identity = ClaimIdentity(row.bot, row.update_id, attempt, PLAIN_CLAIM)
                received_at = now if row.received_at is None else row.received_at
                claimed = Claimed(identity, row.body, row.update_type, None, received_at)
                self._start(lane, claimed, lease_until, now).probe = lane.breaker.started(1)
                started += 1
        return started

    def _start(self, lane: Lane, claimed: Claimed, lease_until: int, now: int) -> Attempt:
        attempt = Attempt(lane, claimed, lease_until, now)
        lane.in_flight += 1
        self._in_flight += 1
        self._attempts.add(attempt)
        if log.isEnabledFor(logging.DEBUG):
            AttemptLog.of(log, attempt.identity).debug("claimed, lease until %d", lease_until)
        attempt.task = asyncio.create_task(self._run(attempt))
        # In a callback, not in _run: a task cancelled before its first step never runs it.
        attempt.task.add_done_callback(lambda _: self._finished(attempt))
        return attempt

    def _finished(self, attempt: Attempt) -> None:
        lane = attempt.lane
        lane.meters.attempts["lost" if attempt.lost else attempt.outcome].inc()
        self._attempts.discard(attempt)
        lane.in_flight -= 1
        self._in_flight -= 1
        if attempt.probe and not attempt.judged:
            lane.breaker.probe_ended_unjudged()
            attempt.unblocks = True
        # Look again only when this end can make something claimable: a waiting update of
        # its chat, capacity the claim loop waits for, or a bot that had more due. Otherwise
        # new rows wake the loop themselves, and a poll catches the rest.
        if attempt.unblocks or lane.saturated or self._capacity - self._in_flight == self._refill:
            self._wake.set()

    # -- one attempt ---------------------------------------------------------------------------

    async def _run(self, attempt: Attempt) -> None:
        lane = attempt.lane
        try:
            expires_at = attempt.expires_at
            if expires_at is not None and self._clock.now() > expires_at:
                attempt.forwarding = False
                await self._end(attempt, "expired", EXPIRED)
                return
            started = time.perf_counter()
            try:
                outcome = await lane.downstream.forward(
                    attempt.identity, attempt.claimed.body, attempt.lease_until
                )
            except asyncio.CancelledError:
                if attempt.handed_back:
                    attempt.forwarding = False
                    attempt.outcome = "handed_back"
                    now = self._clock.now()
                    await self._settle(attempt, Failed(now, now, HANDED_BACK))
                    return
                if attempt.lost:
                    return  # owner lost: nothing to settle, and no answer to wait for
                raise
            took = time.perf_counter() - started
            lane.meters.forward_duration.observe(took)
            if log.isEnabledFor(logging.DEBUG):
                AttemptLog.of(log, attempt.identity).debug(
                    "forwarded: %s in %.1f ms", outcome.kind, took * 1000
                )
            attempt.forwarding = False
            if attempt.lost:
                AttemptLog.of(log, attempt.identity).info(
                    "late answer ignored (the claim was lost)"
                )
                return
            was_closed = lane.breaker.state == "closed"
            lane.breaker.record(failed=outcome.downstream_failed)
            attempt.judged = True
            if not was_closed:
                attempt.unblocks = True  # a probe's answer: the breaker may let claims pass
            if lane.plain and outcome.kind == "deferred":
                # A plain bot gets no identity to settle with: its 202 is all it can say.
                outcome = Outcome("completed")
            await self._conclude(attempt, outcome)
        except StoreError as error:
            attempt.outcome = "unsettled"
            AttemptLog.of(log, attempt.identity).warning(
                "could not settle (%s); redelivered once its lease lapses",
                error,
            )

    async def _conclude(self, attempt: Attempt, outcome: Outcome) -> None:
        now = self._clock.now()
        bot = attempt.lane.bot
        if outcome.kind == "completed":
            attempt.outcome = "completed"
            await self._settle(attempt, Completed(now))
        elif outcome.kind == "deferred":
            attempt.outcome = "deferred"
            AttemptLog.of(log, attempt.identity).debug("deferred, the downstream settles it")
        elif outcome.kind == "terminal":
            await self._end(attempt, "terminal", outcome.error or "terminal")
        elif attempt.identity.attempt >= bot.max_attempts:
            await self._end(attempt, "spent", f"attempts spent; last: {outcome.error}")
        else:
            retry_at = now + retry_delay_ms(bot, attempt.identity.attempt, outcome)
            expires_at = attempt.expires_at
            if expires_at is not None and retry_at > expires_at:
                await self._end(attempt, "expired", EXPIRED)
                return
            error = outcome.error or "retry"
            attempt.outcome = "retry"
            if await self._settle(attempt, Failed(now, retry_at, error)):
                self._retries.at(retry_at)

    async def _end(self, attempt: Attempt, outcome: AttemptOutcome, error: str) -> None:
        """A terminal outcome: an exhaustion on a durable bot, abandoned otherwise."""
        attempt.outcome = outcome
        now = self._clock.now()
        if not attempt.lane.durable:
            await self._settle(attempt, Abandoned(now, error))
            return
        exhausted = await self._retrying(
            attempt, lambda: self._store.exhaust(attempt.identity, now, error)
        )
        if exhausted:
            AttemptLog.of(log, attempt.identity).warning("exhausted (%s)", error)
            attempt.unblocks = attempt.claimed.queue_key is not None
            if self._exhaustions is not None:
                self._exhaustions.wake()
        else:
            self._lost(attempt, "exhaust_refused")

    async def _settle(self, attempt: Attempt, settlement: Settlement) -> bool:
        """A fenced settle; False (and the owner-lost signal) when it was refused."""
        identity = attempt.identity
        if attempt.lane.plain:

            async def settle_plain() -> bool:
                bot, update_id, number = identity.bot, identity.update_id, identity.attempt
                await self._store.settle(bot, update_id, number, settlement)
                return True  # the base settle cannot say whether it took effect

            return await self._retrying(attempt, settle_plain)
        arrivals = self._arrivals
        settled = await self._retrying(
            attempt, lambda: self._settler.submit((identity, settlement))
        )
        if not isinstance(settlement, Failed):  # a retry keeps its chat blocked
            # The settle reports a later update of the chat it could see; one committed while
            # it ran may have been claimed for and found blocked: look again for it too.
            racing = attempt.claimed.queue_key is not None and self._arrivals != arrivals
            attempt.unblocks = attempt.unblocks or settled.unblocks or racing
        if settled.took_effect:
            if log.isEnabledFor(logging.DEBUG):
                AttemptLog.of(log, attempt.identity).debug(
                    "settled: %s", type(settlement).__name__.lower()
                )
            return True
        self._lost(attempt, "settle_refused")
        return False

    async def _retrying(self, attempt: Attempt, call: Callable[[], Awaitable[Result]]) -> Result:
        """`call`, retried while the database is unavailable and the lease still holds."""
        pause = 0.05
        while True:
            try:
                return await call()
            except StoreUnavailable:
                if self._clock.now() + pause * 1000 > attempt.lease_until:
                    raise
                await asyncio.sleep(pause)
                pause = min(pause * 2, 1.0)

    def _lost(self, attempt: Attempt, reason: LostReason) -> None:
        """The advisory owner-lost signal: cancel the request, settle nothing."""
        if attempt.lost:
            return
        attempt.lost = True
        self.owner_lost += 1
        attempt.lane.meters.owner_lost[reason].inc()
        AttemptLog.of(log, attempt.identity).warning("owner lost (%s)", LOST_BECAUSE[reason])
        if attempt.forwarding and attempt.task is not None:
            attempt.task.cancel()


def _report_exit(task: asyncio.Task[None]) -> None:
    """A background loop of the dispatcher ended other than by being stopped: say so."""
    if not task.cancelled() and task.exception() is not None:
        log.error("dispatcher task %s died", task.get_name(), exc_info=task.exception())
