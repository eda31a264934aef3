"""Running one attempt and judging its outcome: forward it, conclude, settle it fenced.

`AttemptRunner.run` forwards a claimed attempt (unless its deadline has passed) and acts on
the answer (`app.policy`): completed and settled, deferred to the downstream, a retry
settled as failed and due again after its backoff, or an end. An end is an exhaustion on a
durable bot, abandoned otherwise. Every settle is fenced by the claim's identity, and a
write is retried while the database is unavailable and the lease still holds.

A refused settle or exhaustion is the owner-lost signal (`lost`, which the lease keeper
raises too): the request is cancelled, nothing is settled, and a late answer is ignored. An
attempt cancelled because the dispatcher is stopping is handed back: a fenced settle that
makes it due at once, so another process retakes it, and spends none of its budget. So is
one whose lease ran out while the database could not write (`hand_back`): a full disk or a
lost database is not the update's failure, and spends none of its attempts.

A settle or exhaustion that the database cannot take is retried (`_retrying`): a timeout
while the lease holds, a database that cannot write at all until the write lands or is
refused, past the lease if need be. Meanwhile the attempt is `stalled`, and the claim loop
of this process waits (`stalled`): a lease that lapsed in the fault is not retaken here before
its own attempt's settle, so a fault shorter than the lease delivers nothing twice, nor does
a longer one unless another process's claim comes first.

With tracing on (`app.tracing`), each attempt is a CONSUMER span, "process {bot}", in the
update's trace (the child of the intake's span, by the `traceparent` kept with the row),
beginning when its claim did. Within it: the claim (an INTERNAL span with the claim
statement's own times, written once the attempt exists), the forward (a CLIENT span whose
`traceparent` the request carries), and each settle or exhaustion (INTERNAL). The attempt's
span ends with its outcome.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from app import tracing
from app.dispatch.attempt import Attempt
from app.dispatch.clock import Alarm, DatabaseClock
from app.dispatch.forward import in_client_span
from app.dispatch.maintenance import ExhaustionDelivery
from app.dispatch.settler import Settler
from app.logs import AttemptLog
from app.metric_labels import AttemptOutcome, LostReason
from app.policy import Outcome, retry_delay_ms
from app.samples import ANSWER_COUNTS, Tally
from app.store import (
    Abandoned,
    Completed,
    Failed,
    HandedBack,
    OperatorStore,
    Settlement,
    StoreError,
    StoreTimedOut,
    StoreUnavailable,
)
from app.store.storage import failure_level

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

log = logging.getLogger(__name__)
Result = TypeVar("Result")

EXPIRED = "expired"
STALLED_PAUSE_SECONDS = 0.25  # the longest wait between two tries of a write the database refused
# Attempt outcomes that mark the attempt's span an error (a retry, a deferral and a hand-back
# are the plan working; an exhaustion is the update's failure, and so are these).
_FAILED = frozenset({"terminal", "spent", "expired", "unsettled", "lost"})
_SETTLE_SPANS: dict[type[Settlement], str] = {
    Completed: "settle completed",
    Failed: "settle failed",
    Abandoned: "settle abandoned",
    HandedBack: "settle handed_back",
}
LOST_BECAUSE: dict[LostReason, str] = {
    "renewal_refused": "renewal refused",
    "lease_ran_out": "its lease ran out unrenewed",
    "settle_refused": "settle refused",
    "exhaust_refused": "exhaust refused",
}


class AttemptRunner:
    """Runs the attempts of one dispatcher. A retry it settles rings `retries` when due;
    `arrivals` counts the wake-ups for new rows so far (see `_settle`); an exhaustion wakes
    `exhaustions`; `jitter` is the random source of retry backoff."""

    def __init__(
        self,
        store: OperatorStore,
        clock: DatabaseClock,
        settler: Settler,
        *,
        retries: Alarm,
        arrivals: Callable[[], int],
        exhaustions: ExhaustionDelivery | None,
        tally: Tally,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self._store = store
        self._clock = clock
        self._settler = settler
        self._retries = retries
        self._arrivals = arrivals
        self._exhaustions = exhaustions
        self._jitter = jitter
        self._tally = tally  # what the console's charts count (`app.samples`)
        self._tracer = tracing.tracer()
        self.owner_lost = 0  # attempts that found their claim taken or lapsed
        self.stalled = 0  # attempts whose settle waits for a database that cannot write

    async def run(self, attempt: Attempt, forwarded: Callable[[Attempt], None]) -> None:
        """Forward and conclude `attempt`; `forwarded` is called once its request has ended
        (answered, failed or never sent), before its settle: the request no longer counts
        against the limits of requests in flight."""
        if self._tracer is None:
            await self._run(attempt, forwarded)
        else:
            await self._traced(self._tracer, attempt, forwarded)

    async def _traced(
        self, tracer: Tracer, attempt: Attempt, forwarded: Callable[[Attempt], None]
    ) -> None:
        """`_run` in the attempt's span, current meanwhile (its log lines carry its ids)."""
        from opentelemetry.trace import SpanKind, StatusCode

        identity = attempt.identity
        claim = attempt.claim
        span = tracer.start_span(
            f"process {identity.bot}",
            context=tracing.context_of(attempt.claimed.trace_context),
            kind=SpanKind.CONSUMER,
            start_time=None if claim is None else claim.started_ns,
            attributes={
                "messaging.system": "telegram_intake",
                "messaging.operation.type": "process",
                "messaging.destination.name": identity.bot,
                "messaging.message.id": str(identity.update_id),
                tracing.BOT: identity.bot,
                tracing.UPDATE_ID: identity.update_id,
                tracing.ATTEMPT: identity.attempt,
                tracing.CLAIM_ID: identity.claim_id,
            },
        )
        token = tracing.make_current(span)
        try:
            if claim is not None:
                # The claim ran before the attempt existed, for its whole batch: its span is
                # written afterwards, with the statement's own times.
                tracer.start_span(
                    "claim",
                    start_time=claim.started_ns,
                    attributes={"messaging.batch.message_count": claim.batch},
                ).end(end_time=claim.ended_ns)
            await self._run(attempt, forwarded)
        finally:
            tracing.release(token)
            outcome = "lost" if attempt.lost else attempt.outcome
            span.set_attribute(tracing.OUTCOME, outcome)
            if outcome in _FAILED:
                span.set_status(StatusCode.ERROR, outcome)
            span.end()

    async def _forward(self, attempt: Attempt) -> Outcome:
        """The attempt's request, in a CLIENT span when tracing is on."""
        downstream = attempt.lane.downstream
        claimed = attempt.claimed
        return await in_client_span(
            self._tracer,
            downstream.traced_address,
            lambda traceparent: downstream.forward(
                attempt.identity,
                claimed.body,
                attempt.lease_until,
                received_at=claimed.received_at,
                traceparent=traceparent,
            ),
        )

    async def _run(self, attempt: Attempt, forwarded: Callable[[Attempt], None]) -> None:
        lane = attempt.lane
        try:
            expires_at = attempt.expires_at
            if expires_at is not None and self._clock.now() > expires_at:
                forwarded(attempt)
                await self._end(attempt, "expired", EXPIRED)
                return
            unreadable = attempt.claimed.unreadable
            if unreadable is not None:  # never forwarded as it is stored (docs/privacy.md)
                forwarded(attempt)
                AttemptLog.of(log, attempt.identity).error("not forwarded: %s", unreadable)
                await self._end(attempt, "terminal", unreadable)
                return
            started = time.perf_counter()
            try:
                outcome = await self._forward(attempt)
            except asyncio.CancelledError:
                if attempt.handed_back:
                    forwarded(attempt)
                    attempt.outcome = "handed_back"
                    # At the latest the last proven lease, which it held then: a hand-back
                    # after the lease ran out lands while no other claim took the update.
                    at = min(self._clock.now(), attempt.lease_until)
                    await self._settle(attempt, HandedBack(at))
                    return
                if attempt.lost:
                    return  # owner lost: nothing to settle, and no answer to wait for
                raise
            took = time.perf_counter() - started
            lane.meters.forward_duration.observe(took)
            lane.meters.answers[outcome.answer].inc()
            self._count(attempt, ANSWER_COUNTS[outcome.answer])
            if log.isEnabledFor(logging.DEBUG):
                AttemptLog.of(log, attempt.identity).debug(
                    "forwarded: %s in %.1f ms", outcome.kind, took * 1000
                )
            forwarded(attempt)
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

    def _count(self, attempt: Attempt, name: str) -> None:
        """One more `name` in the charts' samples, for its lane, now."""
        lane = attempt.lane
        self._tally.count(lane.name, lane.destination, self._clock.now(), name)

    def hand_back(self, attempt: Attempt, error: StoreError) -> None:
        """Its lease is running out while the database cannot write (`error`, its renewals'):
        stop the request and give the update back, spending none of its attempts."""
        if attempt.lost or attempt.handed_back:
            return
        attempt.handed_back = True
        AttemptLog.of(log, attempt.identity).log(
            failure_level(error),
            "handed back: its lease ran out while the database could not write (%s)",
            error,
        )
        if attempt.forwarding and attempt.task is not None:
            attempt.task.cancel()

    def lost(self, attempt: Attempt, reason: LostReason) -> None:
        """The advisory owner-lost signal: cancel the request, settle nothing."""
        if attempt.lost:
            return
        attempt.lost = True
        self.owner_lost += 1
        attempt.lane.meters.owner_lost[reason].inc()
        AttemptLog.of(log, attempt.identity).warning("owner lost (%s)", LOST_BECAUSE[reason])
        if attempt.forwarding and attempt.task is not None:
            attempt.task.cancel()

    async def _conclude(self, attempt: Attempt, outcome: Outcome) -> None:
        now = self._clock.now()
        bot = attempt.lane.options
        if outcome.kind == "completed":
            attempt.outcome = "completed"
            if await self._settle(attempt, Completed(now, outcome.status)):
                since = max(0, now - attempt.claimed.received_at)
                attempt.lane.meters.delivery.observe(since / 1000)
                lane = attempt.lane
                self._tally.delivered(lane.name, lane.destination, now, since)
        elif outcome.kind == "deferred":
            attempt.outcome = "deferred"
            AttemptLog.of(log, attempt.identity).debug("deferred, the downstream settles it")
        elif outcome.kind == "terminal":
            await self._end(attempt, "terminal", outcome.error or "terminal", outcome.status)
        elif attempt.claimed.counted >= bot.max_attempts:
            error = f"attempts spent; last: {outcome.error}"
            await self._end(attempt, "spent", error, outcome.status)
        else:
            retry_at = now + retry_delay_ms(
                bot, attempt.claimed.counted, outcome, jitter=self._jitter
            )
            expires_at = attempt.expires_at
            if expires_at is not None and retry_at > expires_at:
                await self._end(attempt, "expired", EXPIRED, outcome.status)
                return
            error = outcome.error or "retry"
            attempt.outcome = "retry"
            if await self._settle(attempt, Failed(now, retry_at, error, outcome.status)):
                self._retries.at(retry_at)
                self._count(attempt, "retried")

    async def _end(
        self, attempt: Attempt, outcome: AttemptOutcome, error: str, status: int | None = None
    ) -> None:
        """A terminal outcome: an exhaustion on a durable bot, abandoned otherwise."""
        attempt.outcome = outcome
        now = self._clock.now()
        if not attempt.lane.durable:
            if await self._settle(attempt, Abandoned(now, error, status)):
                self._count(attempt, "exhausted")
            return
        exhausted = await self._exhaust(attempt, now, error, status)
        if exhausted:
            self._count(attempt, "exhausted")
            # The error may quote the downstream's answer, which may quote its user: the
            # history keeps it (sealed); the log names the outcome and the status.
            AttemptLog.of(log, attempt.identity).warning("exhausted (%s, %s)", outcome, status)
            attempt.unblocks = attempt.claimed.queue_key is not None
            if self._exhaustions is not None:
                self._exhaustions.wake()
        else:
            self.lost(attempt, "exhaust_refused")

    async def _exhaust(self, attempt: Attempt, now: int, error: str, status: int | None) -> bool:
        """The exhaustion's fenced write."""
        return await tracing.recorded(
            self._tracer,
            "exhaust",
            lambda: self._retrying(
                attempt, lambda: self._store.exhaust(attempt.identity, now, error, status=status)
            ),
        )

    async def _settle(self, attempt: Attempt, settlement: Settlement) -> bool:
        """A fenced settle; False (and the owner-lost signal) when it was refused."""
        name = _SETTLE_SPANS[type(settlement)]
        return await tracing.recorded(
            self._tracer, name, lambda: self._settle_now(attempt, settlement)
        )

    async def _settle_now(self, attempt: Attempt, settlement: Settlement) -> bool:
        identity = attempt.identity
        if attempt.lane.plain:

            async def settle_plain() -> bool:
                bot, update_id, number = identity.bot, identity.update_id, identity.attempt
                await self._store.settle(bot, update_id, number, settlement)
                return True  # the base settle cannot say whether it took effect

            return await self._retrying(attempt, settle_plain)
        arrivals = self._arrivals()
        settled = await self._retrying(
            attempt, lambda: self._settler.submit((identity, settlement))
        )
        if not isinstance(settlement, Failed):  # a retry keeps its chat blocked
            # The settle reports a later update of the chat it could see; one committed while
            # it ran may have been claimed for and found blocked: look again for it too.
            racing = attempt.claimed.queue_key is not None and self._arrivals() != arrivals
            attempt.unblocks = attempt.unblocks or settled.unblocks or racing
        if settled.took_effect:
            if log.isEnabledFor(logging.DEBUG):
                AttemptLog.of(log, attempt.identity).debug(
                    "settled: %s", type(settlement).__name__.lower()
                )
            return True
        self.lost(attempt, "settle_refused")
        return False

    async def _retrying(self, attempt: Attempt, call: Callable[[], Awaitable[Result]]) -> Result:
        """`call`, a write fenced by `attempt`'s claim, retried while the database cannot take
        it: one that timed out while the lease holds; one that cannot write at all (a full
        disk, a lost connection) until it lands or is refused. The fenced write matches the
        exact claim, which no lapse of the lease changes, only another claim: and none can
        be written while this one cannot. Meanwhile the attempt is `stalled`."""
        pause = 0.05
        try:
            while True:
                try:
                    return await call()
                except StoreTimedOut:
                    if self._clock.now() + pause * 1000 > attempt.lease_until:
                        raise
                except StoreUnavailable:
                    if not attempt.stalled:
                        attempt.stalled = True
                        self.stalled += 1
                await asyncio.sleep(pause)
                pause = min(pause * 2, STALLED_PAUSE_SECONDS)
        finally:
            if attempt.stalled:
                attempt.stalled = False
                self.stalled -= 1
