"""The dispatcher: the workers of one process, wired together, started and stopped.

`Dispatcher` makes a lane per destination of each bot (its downstream, breaker and limit,
docs/design.md decision 7) and the parts that
serve them: the claim loop (`app.dispatch.claims`), which starts each attempt with the
attempt runner (`app.dispatch.runner`), and the jobs beside it: the lease keeper
(`app.dispatch.leases`), the resync of the database's clock (`DatabaseClock`, which every
comparison with a lease uses), the PostgreSQL LISTEN for wake-ups, pruning and the delivery
of exhaustions (`app.dispatch.maintenance`).

On `stop`, claiming ends, attempts get `shutdown_grace_seconds` to finish, and the rest are
handed back with a fenced settle that makes them due at once, so another process retakes
them.

Every attempt is counted once as it ends, by bot and outcome (`app.metrics`), with the
duration of its downstream request, its lease renewals and owner-lost events.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import httpx

from app.bot_settings import BotSettings
from app.config import Settings
from app.dispatch.attempt import Lane
from app.dispatch.claims import ClaimLoop
from app.dispatch.clock import Alarm, DatabaseClock
from app.dispatch.events import EventDelivery, WebhookWatch, watch_backlog_forever
from app.dispatch.leases import LeaseKeeper
from app.dispatch.liveness import Liveness
from app.dispatch.maintenance import ExhaustionDelivery, keep_table_forever, prune_forever
from app.dispatch.privacy import erasures_forever, reencryption_forever, retention_forever
from app.dispatch.runner import AttemptRunner
from app.dispatch.settler import Settler
from app.intake.polling import Poller
from app.metrics import Metrics
from app.samples import flush_forever
from app.store import OperatorStore, StoreError
from app.store.storage import failure_level

log = logging.getLogger(__name__)
# After the grace period, how long a stop waits at most for hand-backs and the last settles.
STOP_BOUND_SECONDS = 5.0


class Dispatcher:
    """The workers of one process, for the bots given (default: every bot of `settings`).

    `monotonic_ns` is the local clock that its database clock and breakers read, `jitter` the
    random source of retry backoff: tests pass fakes, to move time by hand."""

    def __init__(
        self,
        store: OperatorStore,
        settings: Settings,
        transport: httpx.AsyncBaseTransport,
        *,
        bots: Sequence[BotSettings] | None = None,
        metrics: Metrics | None = None,
        monotonic_ns: Callable[[], int] = time.monotonic_ns,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self._store = store
        self._settings = settings
        chosen = settings.bots if bots is None else bots
        self._bots = list(chosen)
        metrics = metrics or Metrics.of(settings)
        self._metrics = metrics
        self._transport = transport
        self._clock = DatabaseClock(store, monotonic_ns=monotonic_ns)
        metrics.clock_offset(self._clock.host_offset_seconds)
        self._lanes = []
        for bot in chosen:
            for target in bot.targets:
                meters = metrics.dispatch(bot.name, target.name)
                lane = Lane(
                    bot,
                    transport,
                    meters,
                    destination=target.name,
                    monotonic_ns=monotonic_ns,
                    now=self._clock.now,  # what its signatures and Retry-After read
                )
                meters.in_flight.set_function(functools.partial(_in_flight, lane))
                self._lanes.append(lane)
        self._reports: set[asyncio.Task[None]] = set()
        for lane in self._lanes:
            lane.breaker.on_change = functools.partial(
                self._report_breaker, lane.name, lane.destination
            )
        self._settler = Settler(store)
        self._tick = min(1.0, min((lane.lease_ms for lane in self._lanes), default=6000) / 6000)
        self._wake = asyncio.Event()
        self._arrivals = 0  # wake-ups for new rows so far (see AttemptRunner._settle)
        self._retries = Alarm(self._clock, self._wake.set)  # a wake-up as each retry falls due
        self.listening = asyncio.Event()  # set once NOTIFY wake-ups arrive (PostgreSQL)
        self._background: dict[str, asyncio.Task[None]] = {}
        self._claim_loop: asyncio.Task[None] | None = None
        self._liveness = Liveness(
            stall_seconds=settings.worker_stall_seconds, monotonic_ns=monotonic_ns
        )
        self._stopping = False
        self._pollers: list[Poller] = []
        exhaustion_targets = {
            (lane.name, lane.destination): lane.downstream
            for lane in self._lanes
            if lane.durable and lane.options.exhaustion_url is not None
        }
        self._exhaustions = (
            ExhaustionDelivery(
                store,
                self._clock,
                exhaustion_targets,
                retry_seconds=settings.exhaustion_retry_seconds,
                meters={(lane.name, lane.destination): lane.meters for lane in self._lanes},
            )
            if exhaustion_targets
            else None
        )
        self._runner = AttemptRunner(
            store,
            self._clock,
            self._settler,
            retries=self._retries,
            arrivals=lambda: self._arrivals,
            exhaustions=self._exhaustions,
            tally=metrics.tally,
            jitter=jitter,
        )
        self._claims = ClaimLoop(
            store,
            self._clock,
            self._lanes,
            self._runner,
            wake=self._wake,
            capacity=settings.worker_concurrency,
            batch=settings.claim_batch,
            poll_seconds=settings.poll_interval_seconds,
            beat=self._liveness.beater("claim loop"),
        )

    @property
    def clock(self) -> DatabaseClock:
        return self._clock

    @property
    def in_flight(self) -> int:
        """Attempts started and not yet ended: forwarding, or settling after their answer."""
        return len(self._claims.attempts)

    @property
    def owner_lost(self) -> int:
        """Attempts that found their claim taken or lapsed."""
        return self._runner.owner_lost

    @property
    def claim_passes(self) -> int:
        """Turns of the claim loop so far that looked at every bot (claiming or not, as the
        breakers and capacity allowed) and did not fail: each a chance to claim."""
        return self._claims.passes

    def wake(self) -> None:
        """New updates are due: look now instead of at the next poll."""
        self._arrivals += 1
        self._wake.set()

    async def start(self) -> None:
        for lane in self._lanes:
            needs = f"{lane.bot.needs}, destination {lane.destination!r}"
            self._store.require(lane.options.capability, needs)
        for bot in self._bots:
            if bot.source == "polling":  # its lease and offset are revision 0004's
                self._store.require("durable", f"bot {bot.name!r} polling getUpdates")
        await self._clock.sync()
        await self._settler.start()
        settings = self._settings
        keeper = LeaseKeeper(
            self._store,
            self._clock.now,
            self._claims.attempts,
            self._runner.lost,
            self._runner.hand_back,
            tick=self._tick,
            beat=self._liveness.beater("lease keeper"),
        )
        background = {
            "lease keeper": keeper.run(),
            "clock": self._clock.run(),
            "listener": self._store.listen(self.wake, listening=self.listening),
            "prune": prune_forever(
                self._store,
                self._clock,
                retention_ms=int(settings.retention_seconds * 1000),
                interval=settings.prune_interval_seconds,
            ),
            "upkeep": keep_table_forever(self._store),
            "erasures": erasures_forever(self._store, self._clock),
            "retention": retention_forever(self._store, self._clock, self._bots),
            "re-encryption": reencryption_forever(
                self._store, interval=settings.prune_interval_seconds
            ),
            # The console's charts: this process's counts, and the backlog once a minute.
            "samples": flush_forever(
                self._store, self._metrics.tally, self._clock.now, backlog=True
            ),
        }
        if self._exhaustions is not None:
            background["exhaustion delivery"] = self._exhaustions.run()
        background.update(self._operations())
        background.update(self._sources())
        self._background = {
            name: asyncio.create_task(job, name=name) for name, job in background.items()
        }
        self._claim_loop = asyncio.create_task(self._claims.run(), name="claim loop")
        for task in [*self._background.values(), self._claim_loop]:
            task.add_done_callback(_report_exit)

    def _sources(self) -> dict[str, Coroutine[Any, Any, None]]:
        """A long poller for each bot whose updates come by getUpdates (`app.intake.polling`):
        in every process, each polling only while it holds the bot's lease."""
        self._pollers = [
            Poller(
                self._store,
                self._clock.now,
                self._settings,
                bot,
                self._metrics,
                on_added=self.wake,
            )
            for bot in self._bots
            if bot.source == "polling"
        ]
        return {f"poller {poller.bot.name}": poller.run() for poller in self._pollers}

    def stopped_sources(self) -> dict[str, str]:
        """Why a bot's updates cannot come in (a poller whose token Telegram refuses), by bot."""
        return {p.bot.name: p.stopped for p in self._pollers if p.stopped is not None}

    def _operations(self) -> dict[str, Coroutine[Any, Any, None]]:
        """The loops of operational events (`app.dispatch.events`) these settings ask for."""
        settings, loops = self._settings, {}
        if settings.operations_url is not None:
            delivery = EventDelivery(
                self._store, self._clock, settings, self._transport, self._metrics
            )
            loops["operational events"] = delivery.run()
            loops["backlog watch"] = watch_backlog_forever(
                self._store,
                self._clock,
                [bot.name for bot in self._bots],
                stale_after_seconds=settings.stale_after_seconds,
            )
        watch = WebhookWatch(self._store, self._clock, settings, self._bots, self._metrics)
        if settings.webhook_check_seconds > 0 and watch.bots:
            loops["webhook watch"] = watch.run()
        return loops

    def problems(self) -> list[str]:
        """Why this process cannot deliver, for its /healthz: a loop that died or stalled
        (`app.dispatch.liveness`); empty while all is well, and once stopping."""
        if self._stopping or self._claim_loop is None:
            return []
        tasks: dict[str, asyncio.Task[None] | None] = {
            "claim loop": self._claim_loop,
            "settler": self._settler.task,
            **self._background,
        }
        return self._liveness.problems(tasks)

    def _report_breaker(self, bot: str, destination: str, state: str) -> None:
        """Record a breaker transition in the bot's (or destination's) row, for operators (not
        awaited: the attempt that moved the breaker does not wait for it)."""

        async def report() -> None:
            try:
                at = self._clock.now()
                await self._store.report_breaker(bot, state, at=at, destination=destination)
            except (StoreError, ValueError) as error:
                log.log(
                    failure_level(error),
                    "could not record bot %r's breaker %s (%s): %s",
                    bot,
                    state,
                    destination,
                    error,
                )

        task = asyncio.create_task(report())
        self._reports.add(task)
        task.add_done_callback(self._reports.discard)

    async def stop(self) -> None:
        """Stop claiming, give attempts the grace period, hand the rest back, stop. However
        the database behaves, this returns within the grace period plus STOP_BOUND_SECONDS:
        what has not settled by then is left to its lease, which lapses, and another process
        retakes the update (nothing is lost, it is delivered again)."""
        self._stopping = True
        self._claims.stop()
        if self._claim_loop is not None:
            await asyncio.gather(self._claim_loop, return_exceptions=True)
        attempts = self._claims.attempts
        tasks = [attempt.task for attempt in attempts if attempt.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=self._settings.shutdown_grace_seconds)
        handed_back = [a for a in attempts if a.forwarding and a.task is not None]
        for attempt in handed_back:
            attempt.handed_back = True
            assert attempt.task is not None
            attempt.task.cancel()
        bound = asyncio.get_running_loop().time() + STOP_BOUND_SECONDS
        if tasks:
            _, unsettled = await asyncio.wait(tasks, timeout=STOP_BOUND_SECONDS)
            if unsettled:
                log.warning(
                    "%d attempts did not settle within %.0f s of the grace period (the database"
                    " did not answer): their leases lapse and other processes retake them",
                    len(unsettled),
                    STOP_BOUND_SECONDS,
                )
                for task in unsettled:
                    task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        try:
            async with asyncio.timeout_at(bound):
                await self._settler.stop()
                if handed_back:
                    with contextlib.suppress(StoreError):
                        await self._store.announce()  # other processes take them over at once
        except TimeoutError:
            if self._settler.task is not None:
                self._settler.task.cancel()
        self._retries.cancel()
        for job in self._background.values():
            job.cancel()
        await asyncio.gather(*self._background.values(), return_exceptions=True)


def _in_flight(lane: Lane) -> int:
    """A lane's requests in flight, read when the metrics are scraped."""
    return lane.in_flight


def _report_exit(task: asyncio.Task[None]) -> None:
    """A background loop of the dispatcher ended other than by being stopped: say so."""
    if not task.cancelled() and task.exception() is not None:
        log.error("dispatcher task %s died", task.get_name(), exc_info=task.exception())
