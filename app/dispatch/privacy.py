"""The workers' side of personal data (docs/privacy.md): erasure jobs worked as soon as they are
requested, bodies erased once no longer needed, and the re-encryption to the ring's current key.

Each runs in every worker process; the store makes each row's work one process's at a time
(an erasure job's lease, the re-encryption's lock per batch), so more processes only take
over sooner when one dies.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

from app.bot_settings import BotSettings
from app.dispatch.clock import DatabaseClock
from app.dispatch.maintenance import pause_for, repeat_forever
from app.store import OperatorStore
from app.store.erasures.roles import Erasures
from app.store.operator_types import Erasure

log = logging.getLogger(__name__)

DAY_MS = 86_400_000
ERASURE_CHECK_SECONDS = 1.0  # how soon a requested erasure starts: one indexed read a second
ERASURE_LEASE_MS = 30_000  # a job whose process died is taken over this long after its batch


async def erasures_forever(store: OperatorStore, clock: DatabaseClock) -> None:
    """Work every requested erasure to its end (none below revision 0009)."""

    async def erase() -> None:
        finished = await store.work_on_erasures(clock.now, lease_ms=ERASURE_LEASE_MS)
        for done in finished:
            verb = "would erase" if done.dry_run else "erased"
            log.info(
                "erasure %d of bot %r (%s): %s %d updates, %d attempts, %d events",
                done.id, done.bot, done.kind, verb, done.updates, done.attempts, done.events,
            )  # fmt: skip
        if any(not done.dry_run and done.updates for done in finished):
            # PostgreSQL keeps a deleted row's bytes in its page until a vacuum frees them for
            # reuse: ask for one now rather than when autovacuum's threshold is met (SQLite
            # zeroes them as it deletes: secure_delete).
            await store.reclaim_space(min_dead_rows=1, scale=0.0, min_age_seconds=0.0)

    await repeat_forever("erasures", erase, pause_for(ERASURE_CHECK_SECONDS))


async def worked_until_done(
    store: Erasures, erasure_id: int, now: Callable[[], int], *, within: float | None = None
) -> Erasure | None:
    """Work requested erasures here (`erasure_id` among them) until that one is done, waiting
    while another process holds it: for a command or a page that waits for its own rather
    than for the workers. Gives up after `within` seconds (None: never); the job as it stands."""
    deadline = None if within is None else time.monotonic() + within
    job = await store.get_erasure(erasure_id)
    while job is not None and job.state != "done":
        if deadline is not None and time.monotonic() > deadline:
            break
        await store.work_on_erasures(now, lease_ms=ERASURE_LEASE_MS)
        job = await store.get_erasure(erasure_id)
        if job is not None and job.state != "done":  # another process holds it
            await asyncio.sleep(0.2)
    return job


async def reencryption_forever(store: OperatorStore, *, interval: float) -> None:
    """Move every stored value to the ring's current key, a batch at a time with other work
    between, then look again after `interval`: a pass that finds nothing reads each table
    once."""

    async def reencrypt() -> None:
        moved = 0
        while done := await store.reencrypt():
            moved += done
            await asyncio.sleep(0)
        if moved:
            log.info("re-encryption: %d rows moved to the ring's current key", moved)

    await repeat_forever("re-encryption", reencrypt, pause_for(interval))


RETENTION_CHECK_SECONDS = 1.0  # how soon after its delivery an "until_delivered" body goes


async def retention_forever(
    store: OperatorStore, clock: DatabaseClock, bots: Sequence[BotSettings]
) -> None:
    """Erase the bodies of delivered updates once their bot's `body_retention` has passed:
    at once for "until_delivered", after that many days otherwise. Bots without one keep
    their bodies as long as their rows (the prune)."""
    kept = [(bot.name, bot.body_retention) for bot in bots if bot.body_retention is not None]

    async def erase() -> None:
        now = clock.now()
        for name, retention in kept:
            days = 0 if retention == "until_delivered" else retention
            erased = await store.erase_delivered_bodies(
                name, settled_before=now - days * DAY_MS, at=now
            )
            if erased:
                log.info("bot %r: erased the bodies of %d delivered updates", name, erased)

    if kept:
        await repeat_forever("retention", erase, pause_for(RETENTION_CHECK_SECONDS))
