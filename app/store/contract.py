"""The store contract: three capability levels, each a typing Protocol.

A store declares the highest level it meets in `capability`. Times are integer epoch
milliseconds passed in by the caller, so every rule is testable without a clock.

- base (`UpdateStore`): revision 0001 columns only, fenced by attempt number (a table at
  0002 serves this level until upgraded to head).
- fenced (`FencedUpdateStore`): every transition compares the full `ClaimIdentity`.
- durable (`DurableUpdateStore`): a terminal failure stays until its exact acknowledgement;
  from revision 0004 it includes operator control (`OperatorStore`: pause, rate limits,
  redrive, park, search, attempt history, the audit log).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Protocol, runtime_checkable

from sqlalchemy.ext.asyncio import AsyncConnection

from app.store.types import (
    ActivitySlot,
    AttemptRecord,
    AuditEntry,
    BotControl,
    BotStats,
    BulkOutcome,
    Capability,
    Claimed,
    ClaimIdentity,
    DueUpdate,
    Exhaustion,
    ExhaustionFilter,
    NewUpdate,
    OperationalEvent,
    Ordering,
    SearchCursor,
    SearchPage,
    Settlement,
    StoredUpdate,
    UpdateFilter,
    WebhookInfo,
)


@runtime_checkable
class UpdateStore(Protocol):
    """Base level: record, claim, renew, settle, list due rows and prune."""

    @property
    def capability(self) -> Capability:
        """ "base", "fenced" or "durable": the highest level the live schema serves."""
        ...

    async def close(self) -> None:
        """Release connections; the store is unusable afterwards."""
        ...

    def require(self, level: Capability, feature: str) -> None:
        """Raise SchemaError, naming `feature` and `alembic upgrade head`, when the live schema
        is below `level`; nothing otherwise."""
        ...

    async def ping(self) -> None:
        """One round trip to the database; StoreError when it does not answer."""
        ...

    async def database_time(self) -> int:
        """The database's clock now, epoch ms: the clock every lease is judged by."""
        ...

    async def announce(self) -> None:
        """Wake the workers of every other process now (`add_many` wakes them by itself)."""
        ...

    async def listen(
        self, wake: Callable[[], None], *, listening: asyncio.Event | None = None
    ) -> None:
        """Call `wake` whenever another process commits new updates or announces, until
        cancelled; set `listening` once in place. Returns at once where there is no such
        channel (SQLite: every writer is in this process)."""
        ...

    async def add(
        self,
        bot: str,
        update_id: int,
        body: str,
        received_at: int,
        *,
        update_type: str | None = None,
        queue_key: str | None = None,
    ) -> bool:
        """Record a new update as pending; False and no change when the key exists in any state."""
        ...

    async def add_many(self, rows: Sequence[NewUpdate]) -> set[tuple[str, int]]:
        """`add` for a batch, in one commit: the keys that were new. A key already recorded, in
        any state, is left exactly as it was; a key twice in the batch is recorded once, from
        its first row. The intake's group commit; nothing is recorded if the commit fails."""
        ...

    async def get_update(self, bot: str, update_id: int) -> StoredUpdate | None:
        """The row of `(bot, update_id)` as it stands, or None."""
        ...

    async def stats(self) -> list[BotStats]:
        """Rows by bot and state, the oldest undelivered row's receipt, open exhaustions (None
        below revision 0002); in bot order. One scan: an operator's call, not the hot path."""
        ...

    async def claim(
        self,
        bot: str,
        update_id: int,
        *,
        now: int,
        lease_until: int,
        max_attempts: int,
        durable_exhaustion: bool = False,
    ) -> int | None:
        """Lease a claimable row until `lease_until`; the new attempt number.

        Claimable: pending; failed with `due_at <= now` (a retry is due at its time); processing
        with `due_at < now` (a lease is live at exactly `due_at`). None when the row is absent,
        leased, settled, or its attempts are spent; a spent row becomes `abandoned` with error
        'attempts spent' (an unacknowledged exhaustion with `durable_exhaustion`)."""
        ...

    async def renew(
        self, bot: str, update_id: int, attempt: int, lease_until: int, now: int | None = None
    ) -> bool:
        """Extend the lease held by `attempt`; never shortens it. With `now`, a lapsed lease
        (`due_at < now`) is not revived. True when `attempt` holds the row."""
        ...

    async def settle(self, bot: str, update_id: int, attempt: int, settlement: Settlement) -> None:
        """Apply the settlement, only if `attempt` holds a live lease at `settlement.at`."""
        ...

    async def due(
        self,
        *,
        now: int,
        pending_before: int,
        limit: int,
        bots: Sequence[str] | None = None,
    ) -> list[DueUpdate]:
        """Pending rows received at or before `pending_before` and claimable non-pending rows,
        in `(bot, update_id)` order, at most `limit`; only these `bots` when given."""
        ...

    async def prune(self, before: int) -> int:
        """Delete completed and abandoned rows with `settled_at < before`; the count deleted.
        Unacknowledged exhaustions have no `settled_at` and are never pruned. Deletes in
        bounded batches, each its own transaction, so a large prune never holds the table
        (or SQLite's one write lock) for long; one process at a time prunes a table, and a
        prune that finds another one at work returns what it has deleted so far."""
        ...

    async def refresh_statistics(
        self, *, min_changes: int = 1000, min_age_seconds: float = 10.0
    ) -> bool:
        """Gather the planner's statistics of the table again when they never were, or when at least
        `min_changes` rows were written since and they are `min_age_seconds` old or the table has
        since seen more writes than it then had rows (a burst into an empty or small table); whether
        they were gathered now. One process at a time: a call that finds another one at it returns
        False. Upkeep, not a transition: no row changes."""
        ...

    async def reclaim_space(
        self, *, min_dead_rows: int = 1000, scale: float = 0.05, min_age_seconds: float = 10.0
    ) -> bool:
        """Make the space of deleted and superseded rows reusable (PostgreSQL's `VACUUM`) when at
        least `min_dead_rows` plus `scale` times the live rows are dead and the table was last
        vacuumed, by anyone (autovacuum too), `min_age_seconds` ago or never; whether this call
        vacuumed. A vacuum already at work on the table makes a call return at once. Upkeep, not
        a transition: no row changes."""
        ...


@runtime_checkable
class FencedUpdateStore(UpdateStore, Protocol):
    """Fenced level: each claim persists a fresh `claim_id`. A live schema serves it only at
    the head revision, where it serves the durable level too (docs/design.md decision 1)."""

    async def claim_owned(
        self,
        bot: str,
        update_id: int,
        *,
        now: int,
        lease_until: int,
        max_attempts: int,
        durable_exhaustion: bool = False,
    ) -> ClaimIdentity | None:
        """`claim`, returning the full identity of the new attempt."""
        ...

    async def claim_next_owned(
        self,
        *,
        now: int,
        lease_until: int,
        max_attempts: int,
        limit: int,
        ordering: Ordering = "chat",
        bots: Sequence[str] | None = None,
        durable_exhaustion: bool = False,
    ) -> list[Claimed]:
        """Claim up to `limit` due rows in one statement, oldest `due_at` first; concurrent
        callers never take the same row. A pending row is due from its `received_at`. With
        ordering "chat" only the oldest non-terminal row of each `(bot, queue_key)` is eligible.
        The budget is `max_attempts` counted attempts (a hand-back counts none); each claimed
        row's `counted` is its place in it. Spent rows met on the way are ended as `claim` ends
        them and not returned."""
        ...

    async def renew_owned(
        self, identity: ClaimIdentity, lease_until: int, now: int | None = None
    ) -> bool:
        """`renew` for the exact identity."""
        ...

    def transaction(self) -> AbstractAsyncContextManager[AsyncConnection]:
        """A write transaction in the store's own database, for the caller's statements,
        committed on exit: pass it to `owns(..., connection=)` and the check and a domain
        write commit together. No other store method may be called inside it."""
        ...

    async def owns(
        self, identity: ClaimIdentity, at: int, *, connection: AsyncConnection | None = None
    ) -> bool:
        """The write authority: True when `identity` holds a live lease at `at` (live at exactly
        `due_at`). Given the caller's open transaction it runs inside it and, on PostgreSQL,
        locks the row until that transaction ends, so no reclaim passes before its commit."""
        ...

    async def settle_owned(self, identity: ClaimIdentity, settlement: Settlement) -> bool:
        """Apply the settlement if `identity` holds a live lease at `settlement.at`; False
        (and no change) otherwise: the caller lost ownership. `HandedBack` makes the row due
        at once, keeps its error, and spends no attempt: the next claim's `counted` is this
        attempt's, and `max_attempts` allows one more attempt number."""
        ...

    async def settle_many_owned(
        self,
        items: Sequence[tuple[ClaimIdentity, Settlement]],
        *,
        waiting: set[tuple[str, int]] | None = None,
    ) -> list[bool | None]:
        """`settle_owned` for each item, in one commit; for each, whether it took effect, by
        the same fence (every identity field, a live lease at its `settlement.at`), or None
        when the row was held locked by another transaction: not settled, still owned, and
        not waited for (so one locked row never holds up the rest). A key may appear once per
        batch (ValueError otherwise). `waiting`, when given, receives settled
        keys whose chat may have a later update to deliver (a superset is allowed)."""
        ...

    async def owned_lease(
        self, identity: ClaimIdentity, at: int, *, connection: AsyncConnection | None = None
    ) -> int | None:
        """`owns`, answering with the live lease's expiry (epoch ms) instead of True."""
        ...

    async def renewed_lease(
        self, identity: ClaimIdentity, lease_until: int, now: int | None = None
    ) -> int | None:
        """`renew_owned`, answering with the lease's expiry after it instead of True."""
        ...

    async def owned_leases(self, identities: Sequence[ClaimIdentity], at: int) -> list[int | None]:
        """`owned_lease` of many identities at once, in their order: one statement where the
        database can take them all (the callback API's concurrent `owns` share it)."""
        ...

    async def renewed_leases(
        self, renewals: Sequence[tuple[ClaimIdentity, int]], now: int
    ) -> list[int | None]:
        """`renewed_lease(identity, lease_until, now)` of many renewals at once, in their
        order: one statement where the database can take them all (the callback API's
        concurrent `renew` share it). The same identity twice is renewed to the later time."""
        ...


@runtime_checkable
class DurableUpdateStore(FencedUpdateStore, Protocol):
    """Durable level: exhaustions survive until exactly acknowledged, and their delivery to
    `exhaustion_url` is leased across processes."""

    async def exhaust(
        self, identity: ClaimIdentity, at: int, error: str, *, status: int | None = None
    ) -> bool:
        """Turn the exact live claim into an unacknowledged exhaustion keeping `error` (and,
        for its history, the downstream's HTTP `status`)."""
        ...

    async def due_exhaustions(
        self,
        *,
        limit: int,
        after: tuple[str, int] | None = None,
        bots: Sequence[str] | None = None,
    ) -> list[Exhaustion]:
        """Unacknowledged exhaustions after the cursor `(bot, update_id)`, in key order."""
        ...

    async def take_exhaustions(
        self, *, now: int, lease_until: int, limit: int, bots: Sequence[str]
    ) -> list[Exhaustion]:
        """Lease up to `limit` open exhaustions of these bots whose delivery is due (a new
        exhaustion is due at once; a failed delivery at its retry time; a lease lapses after
        `lease_until`), in key order; their delivery is not due again before `lease_until`,
        so concurrent callers never take the same one. Rows not due are not read."""
        ...

    async def delivery_failed(self, exhaustion: Exhaustion, retry_at: int) -> bool:
        """The delivery of `exhaustion` (as `take_exhaustions` gave it) failed: due again at
        `retry_at`, its `deliveries` one more. False and no change when it is no longer that
        open exhaustion with that count (acknowledged, or taken and failed since)."""
        ...

    async def acknowledge_exhaustion(self, identity: ClaimIdentity, at: int) -> bool:
        """Acknowledge the exhaustion with exactly this identity; it becomes prunable, settled
        at `at`. False for any other identity or a row that is not an open exhaustion."""
        ...


@runtime_checkable
class OperatorStore(DurableUpdateStore, Protocol):
    """Operator control (docs/contract.md section 9), part of the durable level from revision 0004:
    what an operator sees and does, persisted so that every process on every host honours it. Every
    action takes `by`, the name it is recorded under in the audit log (an API key's name, never
    the key), and writes that record in the transaction that acts."""

    async def bot_controls(self, bots: Sequence[str] | None = None) -> list[BotControl]:
        """The controls of these bots in bot order (defaults for a bot never touched); every
        bot that has any, when None."""
        ...

    async def pause(self, bot: str, *, at: int, by: str, reason: str | None = None) -> bool:
        """From this commit no claim, in any process, starts an attempt of `bot`; its updates
        are still recorded, attempts in flight finish. True when this call paused it (a bot
        already paused keeps its first pause, and nothing is recorded)."""
        ...

    async def resume(self, bot: str, *, at: int, by: str) -> bool:
        """Lift the pause and wake the workers of every process; False when not paused."""
        ...

    async def set_rate_limit(self, bot: str, per_second: float | None, *, at: int, by: str) -> None:
        """At most `per_second` attempts of `bot` start per second across every process
        (None: no limit). The limit's bucket starts empty."""
        ...

    async def take_tokens(self, bot: str, wanted: int, *, now: int) -> int:
        """How many of `wanted` attempts of `bot` may start now, taken from the bucket that
        every process shares (refilled at the rate, holding a second's worth and at least
        one); `wanted` when the bot has no limit."""
        ...

    async def return_tokens(self, bot: str, count: int) -> None:
        """Give back tokens taken for attempts that did not start."""
        ...

    async def report_breaker(self, bot: str, state: str, *, at: int) -> None:
        """Record a worker's breaker transition for `bot` (closed, open or half_open)."""
        ...

    async def redrive(
        self,
        selection: ExhaustionFilter | Sequence[ClaimIdentity],
        *,
        at: int,
        by: str,
        dry_run: bool = False,
        rate_per_second: float | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> BulkOutcome:
        """Deliver the selected open exhaustions (by filter, or by exact identities) again:
        each stops being an exhaustion and becomes a retry with a fresh attempt budget, due
        from `at`, paced at `rate_per_second` in key order (without one: a selection of one
        bot at that bot's rate limit, else all at once); its attempt numbers continue, so no
        earlier identity matches again. A dry run counts exactly what a real run would
        take now, with a sample, and changes nothing."""
        ...

    async def acknowledge_exhaustions(
        self,
        selection: ExhaustionFilter | Sequence[ClaimIdentity],
        *,
        at: int,
        by: str,
        dry_run: bool = False,
        progress: Callable[[int], None] | None = None,
    ) -> BulkOutcome:
        """`acknowledge_exhaustion` of every selected open exhaustion; a dry run counts
        exactly what a real run would take now."""
        ...

    async def park(self, identity: ClaimIdentity, *, at: int, by: str, reason: str) -> bool:
        """End the attempt of exactly `identity` (leased, or waiting for its retry) as an
        exhaustion with `reason`: its chat moves on, and its late settle is refused."""
        ...

    async def search_updates(
        self, chosen: UpdateFilter, *, after: SearchCursor | None = None, limit: int = 50
    ) -> SearchPage:
        """Rows matching `chosen`, newest first by (received_at, bot, update_id), a page at a
        time after the cursor; pages neither skip nor repeat a row."""
        ...

    async def attempt_history(self, bot: str, update_id: int) -> list[AttemptRecord] | None:
        """Every attempt of the update, oldest first, kept as long as its row; None when no
        such update is recorded."""
        ...

    async def audit_log(
        self, *, after: int | None = None, limit: int = 100, bots: Sequence[str] | None = None
    ) -> list[AuditEntry]:
        """Operator actions, newest first (`after`: the last id of the previous page). With
        `bots` (a key limited to them), only the entries that concern at least one bot and
        none outside `bots`; an entry of every bot (a filter that named none) is left out."""
        ...

    async def activity(
        self, bots: Sequence[str], *, since: int, until: int, slot_ms: int
    ) -> list[ActivitySlot]:
        """Updates received, and delivered (completed), per bot in each slot of `slot_ms`
        from `since` until `until`, every slot with its zeros, oldest first (each slot's bots
        in name order). Delivered counts what is still retained."""
        ...

    # -- operational events (docs/contract.md section 9): written by the transactions that make
    # them ----

    records_events: bool
    """Whether this store writes operational events (opened with `events=True`: the
    service has an `operations_url`). Then every action above writes its event (bot.paused,
    bot.resumed, redrive.finished, breaker.opened and breaker.closed on a change of the shared
    breaker state, exhaustion.created by `exhaust`, `park` and a durable claim of a row whose
    attempts are spent) in the same transaction as what it tells of."""

    async def take_events(
        self, *, now: int, lease_until: int, limit: int
    ) -> list[OperationalEvent]:
        """Lease up to `limit` undelivered events due now, oldest first, until `lease_until`:
        no other process takes them while the lease holds."""
        ...

    async def event_delivered(self, event: OperationalEvent, at: int) -> bool:
        """The receiver took `event`: never sent again. False when its lease had lapsed."""
        ...

    async def event_failed(self, event: OperationalEvent, retry_at: int) -> bool:
        """A delivery failed: due again at `retry_at`, one more failure counted. False when
        its lease had lapsed."""
        ...

    async def watch_backlog(
        self, bots: Sequence[str], *, now: int, stale_after_ms: int
    ) -> list[str]:
        """Write backlog.stale for each of `bots` whose oldest undelivered row was received
        over `stale_after_ms` ago, once an episode across every process (the episode ends
        when its backlog is fresh again); the bots that began one now."""
        ...

    async def take_webhook_check(self, bot: str, *, now: int, next_at: int) -> bool:
        """True to the one caller that makes `bot`'s getWebhookInfo check now (it is due);
        the next is due at `next_at`, for every process."""
        ...

    async def report_webhook_info(self, bot: str, info: WebhookInfo, *, at: int) -> bool:
        """Keep what a getWebhookInfo check saw (`bot_controls` shows it); a last error
        newer than the one kept writes telegram.webhook_error (True)."""
        ...

    # -- long polling (docs/contract.md section 11)
    # -----------------------------------------------------

    async def take_poller(self, bot: str, *, holder: str, now: int, lease_until: int) -> int | None:
        """Take or renew the lease of `bot`'s one getUpdates poller across every process until
        `lease_until`: the offset to ask for (0: none yet) to the holder, None to any other
        caller while the lease holds."""
        ...

    async def record_polled(
        self, bot: str, rows: Sequence[NewUpdate], *, holder: str, now: int, offset: int
    ) -> set[tuple[str, int]] | None:
        """Record a polled batch (as `add_many`) and move the bot's offset to `offset`, in one
        transaction, only while `holder` holds the lease: the new keys, or None (nothing
        written) when the lease was lost."""
        ...

    async def release_poller(self, bot: str, *, holder: str) -> bool:
        """Give up the poller's lease, so another process takes over at once."""
        ...

    # -- console sessions (revision 0005; docs/security.md) --------------------------------

    async def start_session(
        self, session_id: str, *, key_digest: str, at: int, idle_ms: int, lifetime_ms: int
    ) -> None:
        """Keep a new console session `session_id` (a digest of its token) for the key whose
        digest is `key_digest`, started and seen at `at`; sessions that ended by `at` (idle
        past `idle_ms`, or started over `lifetime_ms` ago) are deleted on the way."""
        ...

    async def find_session(
        self, session_id: str, *, at: int, idle_ms: int, lifetime_ms: int, seen: bool = True
    ) -> str | None:
        """The key digest of session `session_id` if it is live at `at` (seen within
        `idle_ms`, started within `lifetime_ms`), with `seen` marking it seen at `at`; None
        for a session that ended, was never started, or was ended by `end_session`."""
        ...

    async def end_session(self, session_id: str) -> bool:
        """End the session in every process at once (sign-out); False when there was none."""
        ...
