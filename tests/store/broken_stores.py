"""Deliberately broken stores: each breaks one rule, and the conformance check must name it.

They are the controls that prove the check can fail. Each subclasses the real store and
replaces exactly one method with a plausible wrong version.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from typing import Any
from unittest import mock

from sqlalchemy import Select, Table, false, select, update

from app.store import (
    ActivitySlot,
    AuditEntry,
    BotControl,
    BulkOutcome,
    Claimed,
    ClaimIdentity,
    Exhaustion,
    ExhaustionFilter,
    Failed,
    HandedBack,
    NewUpdate,
    OperationalEvent,
    SearchCursor,
    SearchPage,
    Settlement,
    SqlUpdateStore,
    UpdateFilter,
    WebhookInfo,
    predicates,
)
from app.store.claims import chat_order
from app.store.exhaustions import statements as exhaustions
from app.store.settles import statements as settles


class RenewIgnoresClaimId(SqlUpdateStore):
    async def renew_owned(
        self, identity: ClaimIdentity, lease_until: int, now: int | None = None
    ) -> bool:
        bot, update_id, attempt = identity.bot, identity.update_id, identity.attempt
        return await self.renew(bot, update_id, attempt, lease_until, now)


class SettleOwnedIgnoresClaimId(SqlUpdateStore):
    async def settle_owned(self, identity: ClaimIdentity, settlement: Settlement) -> bool:
        statement = settles.settle(
            self.table,
            bot=identity.bot,
            update_id=identity.update_id,
            attempt=identity.attempt,
            settlement=settlement,
        )
        return await self._changed(statement)


class ExhaustIgnoresClaimId(SqlUpdateStore):
    async def exhaust(self, identity: ClaimIdentity, at: int, error: str) -> bool:
        t = self.table
        statement = (
            update(t)
            .where(
                t.c.bot == identity.bot,
                t.c.update_id == identity.update_id,
                t.c.attempts == identity.attempt,
                t.c.state == "processing",
                t.c.due_at >= at,
            )
            .values(state="abandoned", exhausted_at=at, settled_at=None, error=error)
            .returning(t.c.state)
        )
        return await self._changed(statement)


class AcknowledgeIgnoresClaimId(SqlUpdateStore):
    async def acknowledge_exhaustion(self, identity: ClaimIdentity, at: int) -> bool:
        t = self.table
        statement = (
            update(t)
            .where(
                t.c.bot == identity.bot,
                t.c.update_id == identity.update_id,
                t.c.attempts == identity.attempt,
                t.c.exhausted_at.is_not(None),
                t.c.acknowledged_at.is_(None),
            )
            .values(acknowledged_at=at, settled_at=at, due_at=at)
            .returning(t.c.state)
        )
        return await self._changed(statement)


class ClaimReadsThenWrites(SqlUpdateStore):
    """Decides in Python from a read, then writes unconditionally: the classic lost race."""

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
        t = self.table
        read = select(t.c.state, t.c.attempts, t.c.due_at).where(
            t.c.bot == bot, t.c.update_id == update_id
        )
        async with self._read() as connection:
            row = (await connection.execute(read)).first()
        if row is None or row.attempts >= max_attempts:
            return None
        if row.state not in ("pending", "failed") and not (
            row.state == "processing" and row.due_at < now
        ):
            return None
        await asyncio.sleep(0.01)  # any await between the read and the write opens the race
        write = (
            update(t)
            .where(t.c.bot == bot, t.c.update_id == update_id)
            .values(state="processing", attempts=row.attempts + 1, due_at=lease_until)
        )
        async with self._write() as connection:
            await connection.execute(write)
        return int(row.attempts) + 1


CONTROLS: dict[type[SqlUpdateStore], str] = {
    RenewIgnoresClaimId: "an attempt fence expires and never adopts a later claim",
    SettleOwnedIgnoresClaimId: "an attempt fence expires and never adopts a later claim",
    ExhaustIgnoresClaimId: "exhaust takes only the exact live claim and keeps its error",
    AcknowledgeIgnoresClaimId: (
        "durable exhaustion survives owner loss until its exact acknowledgement"
    ),
    ClaimReadsThenWrites: "of 8 concurrent claims exactly one takes the update",
}


class SettleManyIgnoresClaimId(SqlUpdateStore):
    async def settle_many_owned(
        self, items: Sequence[tuple[ClaimIdentity, Settlement]]
    ) -> list[bool]:
        results = []
        for identity, settlement in items:
            statement = settles.settle(
                self.table,
                bot=identity.bot,
                update_id=identity.update_id,
                attempt=identity.attempt,
                settlement=settlement,
            )
            results.append(await self._changed(statement))
        return results


CONTROLS[SettleManyIgnoresClaimId] = (
    "a batch settle applies each settlement only for its exact live identity"
)


class SettleOwnedIgnoresAttempt(SqlUpdateStore):
    async def settle_owned(self, identity: ClaimIdentity, settlement: Settlement) -> bool:
        t = self.table
        statement = (
            update(t)
            .where(
                t.c.bot == identity.bot,
                t.c.update_id == identity.update_id,
                t.c.claim_id == identity.claim_id,
                t.c.state == "processing",
                t.c.due_at >= settlement.at,
            )
            .values(predicates.settle_values(t, settlement))
            .returning(t.c.state)
        )
        return await self._changed(statement)


class ExhaustMakesTheRowPrunable(SqlUpdateStore):
    """Records the exhaustion as settled, so the next prune deletes it unacknowledged."""

    async def exhaust(self, identity: ClaimIdentity, at: int, error: str) -> bool:
        t = self.table
        statement = exhaustions.exhaust(t, identity=identity, at=at, error=error).values(
            settled_at=at
        )
        return await self._changed(statement)


class ClaimNextIgnoresBots(SqlUpdateStore):
    async def claim_next_owned(self, **arguments: Any) -> list[Claimed]:  # type: ignore[override]
        return await super().claim_next_owned(**{**arguments, "bots": None})


class ClaimNextIgnoresLimit(SqlUpdateStore):
    async def claim_next_owned(self, **arguments: Any) -> list[Claimed]:  # type: ignore[override]
        return await super().claim_next_owned(**{**arguments, "limit": 1000})


CONTROLS[SettleOwnedIgnoresAttempt] = "an attempt fence expires and never adopts a later claim"
CONTROLS[ExhaustMakesTheRowPrunable] = "exhaust takes only the exact live claim and keeps its error"
CONTROLS[ClaimNextIgnoresBots] = (
    "claim_next_owned: concurrent callers take disjoint sets covering every due row"
)
CONTROLS[ClaimNextIgnoresLimit] = (
    "claim_next_owned: concurrent callers take disjoint sets covering every due row"
)


class AddManyOverwrites(SqlUpdateStore):
    """A batch insert that replaces what is recorded (an upsert), and so resets a leased row
    to pending with the body sent again."""

    async def add_many(self, rows: Sequence[NewUpdate]) -> set[tuple[str, int]]:
        new = set()
        for row in rows:
            key = (row.bot, row.update_id)
            if await self.get_update(row.bot, row.update_id) is not None:
                t = self.table
                async with self._write() as connection:
                    await connection.execute(
                        update(t)
                        .where(t.c.bot == row.bot, t.c.update_id == row.update_id)
                        .values(body=row.body, state="pending", due_at=row.received_at)
                    )
            elif key not in new and await super().add_many([row]):
                new.add(key)
        return new


CONTROLS[AddManyOverwrites] = (
    "a batch insert records each new key once and leaves every recorded key as it was"
)


class HandBackSpendsAnAttempt(SqlUpdateStore):
    """A hand-back settled as a retry due at once: it spends an attempt and loses the error."""

    async def settle_owned(self, identity: ClaimIdentity, settlement: Settlement) -> bool:
        if isinstance(settlement, HandedBack):
            settlement = Failed(settlement.at, settlement.at, "handed back")
        return await super().settle_owned(identity, settlement)


class TakeLeasesNothing(SqlUpdateStore):
    """Every caller gets every due exhaustion: each process delivers each one."""

    async def take_exhaustions(  # type: ignore[override]
        self, *, now: int, lease_until: int, limit: int, bots: Sequence[str]
    ) -> list[Exhaustion]:
        return await super().take_exhaustions(now=now, lease_until=now + 1, limit=limit, bots=bots)


CONTROLS[HandBackSpendsAnAttempt] = (
    "a hand-back spends no attempt, keeps the last error and is fenced"
)
CONTROLS[TakeLeasesNothing] = (
    "each open exhaustion is leased to one deliverer, and its backoff is kept"
)


class ClaimNextWalksOnlyTheWindow(SqlUpdateStore):
    """Chat order by the due-order walk over its window alone, without the walk over the
    chat heads: a queue whose head waits, with a long backlog due first, starves the rest."""

    async def claim_next_owned(self, **arguments: Any) -> list[Claimed]:  # type: ignore[override]
        def no_heads(t: Table, **_: Any) -> Select[Any]:
            return select(t.c.bot, t.c.update_id).where(false())

        # One patched call at a time: two overlapping patches would restore each other's
        # replacement, and the head walk would stay removed for every store after this one.
        serial = self.__dict__.setdefault("_one_patch_at_a_time", asyncio.Lock())
        async with serial:
            with (
                mock.patch.object(chat_order, "_heads_lateral", no_heads),
                mock.patch.object(chat_order, "_heads_scalar", no_heads),
            ):
                return await super().claim_next_owned(**arguments)


CONTROLS[ClaimNextWalksOnlyTheWindow] = (
    "claim_next_owned with chat ordering reaches the queues behind a long blocked one"
)


UPKEEP = "upkeep (statistics, reclaiming space) leaves every row as it was"


class RefreshStatisticsPrunes(SqlUpdateStore):
    """Upkeep that does more than it says: gathering statistics also deletes settled rows."""

    async def refresh_statistics(
        self, *, min_changes: int = 1000, min_age_seconds: float = 10.0
    ) -> bool:
        await self.prune(2**62)
        return await super().refresh_statistics(
            min_changes=min_changes, min_age_seconds=min_age_seconds
        )


CONTROLS[RefreshStatisticsPrunes] = UPKEEP


class ReclaimSpacePrunes(SqlUpdateStore):
    """A vacuum that does more than it says: reclaiming space also deletes settled rows."""

    async def reclaim_space(
        self, *, min_dead_rows: int = 1000, scale: float = 0.05, min_age_seconds: float = 10.0
    ) -> bool:
        await self.prune(2**62)
        return await super().reclaim_space(
            min_dead_rows=min_dead_rows, scale=scale, min_age_seconds=min_age_seconds
        )


CONTROLS[ReclaimSpacePrunes] = UPKEEP


class OwnedLeasesIgnoresClaimId(SqlUpdateStore):
    """A batch of owns that matches the key and attempt only: a forged claim_id passes."""

    async def owned_leases(self, identities: Sequence[ClaimIdentity], at: int) -> list[int | None]:
        leases = []
        for identity in identities:
            row = await self.get_update(identity.bot, identity.update_id)
            held = (
                row is not None
                and row.state == "processing"
                and row.attempts == identity.attempt
                and row.due_at >= at
            )
            leases.append(row.due_at if held and row is not None else None)
        return leases


CONTROLS[OwnedLeasesIgnoresClaimId] = "a batch of owns answers each identity as owns does"


class RenewedLeasesTakeTheLast(SqlUpdateStore):
    """A batch of renewals that applies each in turn as asked, unconditionally: the later
    renewal of the same attempt shortens what the earlier one gave."""

    async def renewed_leases(
        self, renewals: Sequence[tuple[ClaimIdentity, int]], now: int
    ) -> list[int | None]:
        leases: dict[ClaimIdentity, int | None] = {}
        for identity, lease_until in renewals:
            if await self.owns(identity, now):
                t = self.table
                async with self._write() as connection:
                    await connection.execute(
                        update(t)
                        .where(t.c.bot == identity.bot, t.c.update_id == identity.update_id)
                        .values(due_at=lease_until)
                    )
                leases[identity] = lease_until
            else:
                leases.setdefault(identity, None)
        return [leases[identity] for identity, _ in renewals]


CONTROLS[RenewedLeasesTakeTheLast] = (
    "a batch of renewals extends each exact live lease, never shortening one"
)


# -- operator control (revision 0004) -----------------------------------------------------------


class PauseIsLocal(SqlUpdateStore):
    """A pause this process keeps to itself: it reports the bot paused, but the claims (of any
    process) never hear of it."""

    def __init__(self, *arguments: Any, **options: Any) -> None:
        super().__init__(*arguments, **options)
        self.paused: dict[str, tuple[int, str, str | None]] = {}

    async def pause(self, bot: str, *, at: int, by: str, reason: str | None = None) -> bool:
        if bot in self.paused:
            return False
        self.paused[bot] = (at, by, reason)
        return True

    async def bot_controls(self, bots: Sequence[str] | None = None) -> list[BotControl]:
        controls = await super().bot_controls(bots)
        return [
            dataclasses.replace(c, paused_at=p[0], paused_by=p[1], paused_reason=p[2])
            if (p := self.paused.get(c.bot))
            else c
            for c in controls
        ]


CONTROLS[PauseIsLocal] = "a paused bot's updates are recorded but not claimed until it resumes"


class BucketNeverEmpties(SqlUpdateStore):
    """A rate limit that is set and shown but never spends: every attempt may start."""

    async def take_tokens(self, bot: str, wanted: int, *, now: int) -> int:
        return wanted


CONTROLS[BucketNeverEmpties] = (
    "the rate limit's bucket starts empty, refills at its rate and holds a second"
)


class RedriveKeepsTheBudget(SqlUpdateStore):
    """A redrive that makes the rows due again but leaves their spent budget as it was: the
    next claim finds it spent."""

    async def redrive(self, selection: Any, **arguments: Any) -> BulkOutcome:
        done = await super().redrive(selection, **arguments)
        t = self.table
        async with self._write() as connection:
            await connection.execute(update(t).where(t.c.state == "failed").values(uncounted=0))
        return done


CONTROLS[RedriveKeepsTheBudget] = (
    "redrive takes what its dry run counted and no earlier identity matches again"
)


class RedriveIgnoresIdentities(SqlUpdateStore):
    """A redrive by identities that takes every open exhaustion of their bots."""

    async def redrive(self, selection: Any, **arguments: Any) -> BulkOutcome:
        if not isinstance(selection, ExhaustionFilter) and selection:
            bots = tuple(sorted({identity.bot for identity in selection}))
            selection = ExhaustionFilter(bots=bots)
        return await super().redrive(selection, **arguments)


CONTROLS[RedriveIgnoresIdentities] = "redrive by identities takes exactly those, paced in key order"


class AcknowledgeIgnoresChat(SqlUpdateStore):
    """A bulk acknowledgement whose filter drops the chat."""

    async def acknowledge_exhaustions(self, selection: Any, **arguments: Any) -> BulkOutcome:
        if isinstance(selection, ExhaustionFilter):
            selection = dataclasses.replace(selection, chat=None)
        return await super().acknowledge_exhaustions(selection, **arguments)


CONTROLS[AcknowledgeIgnoresChat] = (
    "acknowledge by filter takes what its dry run counted, by every criterion"
)


class ParkTakesTheCurrentAttempt(SqlUpdateStore):
    """A park that ends whatever attempt the row holds now, whichever identity it was given."""

    async def park(self, identity: ClaimIdentity, *, at: int, by: str, reason: str) -> bool:
        row = await self.get_update(identity.bot, identity.update_id)
        if row is None or row.claim_id is None:
            return False
        current = ClaimIdentity(row.bot, row.update_id, row.attempts, row.claim_id)
        return await super().park(current, at=at, by=by, reason=reason)


CONTROLS[ParkTakesTheCurrentAttempt] = (
    "park ends exactly its identity's attempt as an exhaustion and frees its chat"
)


class PruneKeepsHistory(SqlUpdateStore):
    """A prune that deletes the updates and leaves their attempts behind: a key recorded again
    shows attempts it never had."""

    async def prune(self, before: int) -> int:
        with mock.patch.object(self, "attempts_table", None):
            return await super().prune(before)


CONTROLS[PruneKeepsHistory] = "every attempt is recorded with how it ended, as long as its row"


class SearchCursorByTimeOnly(SqlUpdateStore):
    """Search pages that go on strictly after the last row's time: rows received in the same
    millisecond as a page's last one are skipped."""

    async def search_updates(
        self, chosen: UpdateFilter, *, after: SearchCursor | None = None, limit: int = 50
    ) -> SearchPage:
        if after is not None:
            after = (after[0], "0", 0)
        return await super().search_updates(chosen, after=after, limit=limit)


CONTROLS[SearchCursorByTimeOnly] = (
    "search finds rows by every filter, newest first, paging without gaps"
)


class AuditForgetsTheKey(SqlUpdateStore):
    """An audit log that records every action under one name, whoever acted."""

    async def _record(self, connection: Any, **entry: Any) -> None:
        await super()._record(connection, **{**entry, "by": "operator"})


CONTROLS[AuditForgetsTheKey] = (
    "every operator action is in the audit log under its key's name, newest first"
)


class RedriveIgnoresTheBotsRate(SqlUpdateStore):
    """A redrive without a rate that makes everything due at once, whatever the bot's limit."""

    async def _one_bots_rate(self, selection: Any) -> float | None:
        return None


CONTROLS[RedriveIgnoresTheBotsRate] = (
    "a redrive of one bot without a rate goes at that bot's rate limit"
)


class PauseWithoutItsEvent(SqlUpdateStore):
    """A pause that commits without its bot.paused event."""

    async def _emit(self, connection: Any, made: Sequence[tuple[Any, int, dict[str, Any]]]) -> None:
        await super()._emit(connection, [event for event in made if event[0] != "bot.paused"])


CONTROLS[PauseWithoutItsEvent] = (
    "each action writes its operational event, and only a change writes one"
)


class EventDeliveredWithoutItsLease(SqlUpdateStore):
    """A delivery that marks its event delivered by id, whether or not its lease still holds."""

    async def event_delivered(self, event: OperationalEvent, at: int) -> bool:
        assert self.events_table is not None
        e = self.events_table.c
        statement = (
            update(self.events_table)
            .where(e.id == event.id, e.delivered_at.is_(None))
            .values(delivered_at=at, due_at=None)
            .returning(e.id)
        )
        return await self._changed(statement)


CONTROLS[EventDeliveredWithoutItsLease] = (
    "events are delivered under a lease: once, again after a failure, never after"
)


class BacklogStaleEveryCheck(SqlUpdateStore):
    """A backlog watch that forgets its episodes: backlog.stale on every check."""

    async def watch_backlog(
        self, bots: Sequence[str], *, now: int, stale_after_ms: int
    ) -> list[str]:
        assert self.bots_table is not None
        async with self.transaction() as connection:
            await connection.execute(update(self.bots_table).values(stale_since=None))
        return await super().watch_backlog(bots, now=now, stale_after_ms=stale_after_ms)


CONTROLS[BacklogStaleEveryCheck] = (
    "backlog.stale is written once an episode, and again after the backlog is fresh"
)


class WebhookErrorEveryCheck(SqlUpdateStore):
    """A webhook watch that forgets the error it saw: telegram.webhook_error on every check."""

    async def report_webhook_info(self, bot: str, info: WebhookInfo, *, at: int) -> bool:
        assert self.bots_table is not None
        async with self.transaction() as connection:
            await connection.execute(update(self.bots_table).values(webhook_error_date=None))
        return await super().report_webhook_info(bot, info, at=at)


CONTROLS[WebhookErrorEveryCheck] = (
    "one caller takes a due webhook check; a newer error writes webhook_error"
)


class ActivityByReceipt(SqlUpdateStore):
    """Activity that counts a delivery in the slot its update was received in."""

    async def activity(
        self, bots: Sequence[str], *, since: int, until: int, slot_ms: int
    ) -> list[ActivitySlot]:
        table = self.table
        with mock.patch.object(table.c, "due_at", table.c.received_at):
            return await super().activity(bots, since=since, until=until, slot_ms=slot_ms)


CONTROLS[ActivityByReceipt] = "activity counts received and completed rows per bot and slot"


class PolledWithoutTheLease(SqlUpdateStore):
    """A poller that records its batch and moves the offset whoever holds the lease."""

    async def record_polled(
        self, bot: str, rows: Sequence[NewUpdate], *, holder: str, now: int, offset: int
    ) -> set[tuple[str, int]] | None:
        added = await self.add_many(rows)
        return added


CONTROLS[PolledWithoutTheLease] = (
    "one poller holds a bot's lease; a batch and its offset commit only under it"
)


class AuditIgnoresBots(SqlUpdateStore):
    """An audit log read the same for every key, whatever bots it is limited to."""

    async def audit_log(self, **arguments: Any) -> list[AuditEntry]:  # type: ignore[override]
        return await super().audit_log(**{**arguments, "bots": None})


CONTROLS[AuditIgnoresBots] = "the audit log within some bots shows only entries of none but them"


class AuditOfAnyOfItsBots(SqlUpdateStore):
    """An audit log that shows a key every entry that concerns one of its bots, the others'
    in the same entry included."""

    async def audit_log(self, **arguments: Any) -> list[AuditEntry]:  # type: ignore[override]
        bots = arguments.pop("bots", None)
        entries = await super().audit_log(**arguments)
        if bots is None:
            return entries
        return [e for e in entries if set(bots) & set(e.target.split("/")[0].split(","))]


CONTROLS[AuditOfAnyOfItsBots] = "the audit log within some bots shows only entries of none but them"


class SessionNeverIdles(SqlUpdateStore):
    """Sessions found however long they sat idle (only the lifetime ends them)."""

    async def find_session(self, session_id: str, **arguments: Any) -> str | None:  # type: ignore[override]
        return await super().find_session(
            session_id, **{**arguments, "idle_ms": arguments["lifetime_ms"]}
        )


CONTROLS[SessionNeverIdles] = (
    "a console session lives until sign-out, its idle time or its lifetime"
)


class SignOutIsLocal(SqlUpdateStore):
    """A sign-out that ends nothing in the database (a cookie deleted, the session alive)."""

    async def end_session(self, session_id: str) -> bool:
        return True


CONTROLS[SignOutIsLocal] = "a console session lives until sign-out, its idle time or its lifetime"


# -- personal data (revision 0009) --------------------------------------------------------------

ERASE = "an erasure takes every update naming its subject, its history and events"


class ErasureByChatOnly(SqlUpdateStore):
    """An erasure that finds a user by the chat of their private messages (the queue key) and
    misses them everywhere else: a reply to them, a contact card, a group they joined."""

    def _names(self, row: Any, subject: str | None) -> bool:
        return subject is None or row.subjects.split()[0] == subject


CONTROLS[ErasureByChatOnly] = ERASE


class ErasureKeepsHistory(SqlUpdateStore):
    """An erasure that deletes the updates but leaves their attempt history behind."""

    async def _erase_batch(self, connection: Any, keys: Any, *, dry_run: bool) -> dict[str, int]:
        attempts, self.attempts_table = self.attempts_table, None
        try:
            return await super()._erase_batch(connection, keys, dry_run=dry_run)
        finally:
            self.attempts_table = attempts


CONTROLS[ErasureKeepsHistory] = ERASE


class ErasureWithoutItsLease(SqlUpdateStore):
    """Every process works on every unfinished erasure, held or not."""

    async def work_on_erasures(self, now: Any, *, lease_ms: int) -> list[Any]:
        from app.store.erasures import statements as erasures

        take = erasures.take_erasure

        def take_held_too(table: Table, *, now: int, lease_until: int) -> Any:
            return take(table, now=2**62, lease_until=lease_until)

        with mock.patch.object(erasures, "take_erasure", take_held_too):
            return await super().work_on_erasures(now, lease_ms=lease_ms)


CONTROLS[ErasureWithoutItsLease] = "an erasure whose worker died goes on once its lease lapses"


class RetentionIgnoresItsTime(SqlUpdateStore):
    """A retention that erases every delivered body, however recently it was delivered."""

    async def erase_delivered_bodies(self, bot: str, **arguments: Any) -> int:
        return await super().erase_delivered_bodies(bot, **{**arguments, "settled_before": 10**12})


CONTROLS[RetentionIgnoresItsTime] = (
    "retention erases delivered bodies and keeps every row and open exhaustion"
)


# -- the console's minute samples (revision 0011) ----------------------------------------------


class SamplesOverwrite(SqlUpdateStore):
    """Samples that keep the last process's counts of a minute rather than their sum."""

    async def add_samples(self, counts: Sequence[Any]) -> None:
        from app.store.samples import statements as samples
        from app.store.schema_samples import SAMPLE_COUNTS

        def overwrite(table: Table, upsert: Any, rows: Any) -> Any:
            insert = upsert(table)
            return insert.values(list(rows)).on_conflict_do_update(
                index_elements=[table.c.bot, table.c.destination, table.c.minute],
                set_={name: insert.excluded[name] for name in SAMPLE_COUNTS},
            )

        with mock.patch.object(samples, "add", overwrite):
            await super().add_samples(counts)


CONTROLS[SamplesOverwrite] = "samples of one minute add up, whoever counted them"


class BacklogSampledByEveryone(SqlUpdateStore):
    """Every process samples every minute's backlog: the marker's conflict is ignored."""

    async def sample_backlog(self, minute: int, *, now: int) -> bool:
        from app.store.samples import statements as samples

        take = samples.take_minute

        def always(table: Table, upsert: Any, taken: int) -> Any:
            return take(table, upsert, taken + 60_000 * (now % 1_000 + 1))

        with mock.patch.object(samples, "take_minute", always):
            return await super().sample_backlog(minute, now=now)


CONTROLS[BacklogSampledByEveryone] = "one process samples each minute's backlog"
