"""Erasure on request (revision 0009, docs/privacy.md): every stored copy of every update that
names a user or a chat, with its attempt history and its events, or everything a bot stored.

A job is durable: `request_erasure` records it, and whichever process takes it (a worker, or
the CLI's `erase` waiting for its own) works through the bot's rows in update_id order, a
bounded batch per transaction, under a lease that a process that dies lets lapse; the next
goes on from the job's cursor. Deleting a row ends whatever attempt holds it: its `owns`,
renewal and settle find no row. A finished job keeps its counts and loses the id it erased;
its audit entry holds the counts, and `erasure.completed` (with the id, sealed in the outbox
until delivered) lets the bot's own systems follow.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any, cast

from sqlalchemy import Table

from app.privacy.subjects import subjects_of
from app.store import outbox, validate
from app.store.checks import check_actor
from app.store.codec import erasure_at
from app.store.core import SqlCore
from app.store.erasures import statements as erasures
from app.store.errors import Undecryptable
from app.store.operator_types import Erasure, ErasureKind

log = logging.getLogger(__name__)

ERASE_BATCH = 500  # rows a batch reads, at most; the deletes of its matches are one transaction


class _LeaseLost(Exception):
    """Another process took the job over: this one's batch rolls back."""


class ErasureMethods(SqlCore):
    def _erasures(self, feature: str) -> Table:
        return self._needing(self.erasures_table, feature, "0009")

    async def request_erasure(
        self,
        bot: str,
        *,
        kind: ErasureKind,
        subject: int | None,
        at: int,
        by: str,
        dry_run: bool = False,
    ) -> int:
        """Record an erasure of every update of `bot` naming `subject` (a user's or a chat's
        id: the two share one space, a private chat's id being its user's), or of everything
        `bot` stored (`kind` "bot", no subject); its id. Nothing is erased until a process
        works on it (`work_on_erasures`)."""
        table = self._erasures("request_erasure")
        bot, at, by = validate.bot_name(bot), validate.millis("at", at), check_actor(by)
        if kind not in ("user", "chat", "bot"):
            raise ValueError(f"kind {kind!r} is not user, chat or bot")
        if (kind == "bot") != (subject is None):
            raise ValueError("a user or chat erasure names its id; a bot's names none")
        if subject is not None and (type(subject) is not int or abs(subject) >= 1 << 63):
            raise ValueError(f"{kind} id {subject!r} is not an integer id")
        stored = None if subject is None else self.codec.digest(str(subject))
        sealed = None if subject is None else self.codec.seal(str(subject), erasure_at(bot))
        statement = erasures.request_erasure(
            table,
            bot=bot,
            kind=kind,
            subject=stored,
            subject_sealed=sealed,
            dry_run=validate.flag("dry_run", dry_run),
            at=at,
            by=by,
        )
        async with self._write() as connection:
            return int((await connection.execute(statement)).scalar_one())

    async def get_erasure(self, erasure_id: int) -> Erasure | None:
        table = self._erasures("get_erasure")
        statement = erasures.get_erasure(table, erasure_id=validate.positive("id", erasure_id))
        async with self._read() as connection:
            row = (await connection.execute(statement)).first()
        return None if row is None else _erasure(row)

    async def work_on_erasures(self, now: Callable[[], int], *, lease_ms: int) -> list[Erasure]:
        """Take each unfinished job no process holds, oldest first, and work it to its end,
        batch by batch; the jobs finished. A job whose lease another process took over is left
        to it. `now`: the database's clock, in epoch ms."""
        if self.erasures_table is None:
            return []  # below revision 0009: no job can have been requested
        table = self.erasures_table
        lease_ms = validate.positive("lease_ms", lease_ms)
        finished: list[Erasure] = []
        while True:
            held = now() + lease_ms
            async with self._write() as connection:
                statement = erasures.take_erasure(table, now=now(), lease_until=held)
                job = (await connection.execute(statement)).first()
            if job is None:
                return finished
            done = await self._erase(table, job, held, now, lease_ms)
            if done is not None:
                finished.append(done)

    async def _erase(
        self, table: Table, job: Any, held: int, now: Callable[[], int], lease_ms: int
    ) -> Erasure | None:
        after: int | None = job.after_update_id
        subject: str | None = job.subject
        while True:
            statement = erasures.candidates(
                self.table, bot=job.bot, subject=subject, after=after, limit=ERASE_BATCH
            )
            async with self._read() as connection:
                rows = (await connection.execute(statement)).all()
            keys = [(row.bot, row.update_id) for row in rows if self._names(row, subject)]
            if rows:
                after = rows[-1].update_id
            lease_until = now() + lease_ms
            try:
                async with self.transaction() as connection:
                    counts = await self._erase_batch(connection, keys, dry_run=bool(job.dry_run))
                    advanced = erasures.advance(
                        table,
                        erasure_id=job.id,
                        held=held,
                        lease_until=lease_until,
                        after=after if after is not None else 0,
                        **counts,
                    )
                    if (await connection.execute(advanced)).rowcount != 1:
                        raise _LeaseLost
            except _LeaseLost:
                log.warning("erasure %d: taken over by another process", job.id)
                return None
            held = lease_until
            if len(rows) < ERASE_BATCH:
                return await self._finish(table, job, held, now())

    def _names(self, row: Any, subject: str | None) -> bool:
        """Whether a candidate row concerns the subject: by its subjects, or, for a row
        recorded before they were kept, by its body's."""
        if subject is None or row.subjects is not None:
            return True  # the statement matched its subjects already
        try:
            update = json.loads(self._body(row))
        except (Undecryptable, ValueError) as error:
            log.error("erasure: update %s:%s could not be read (%s)", row.bot, row.update_id, error)
            return False
        named = subjects_of(update) if isinstance(update, dict) else ()
        return subject in {self.codec.digest(str(named_id)) for named_id in named}

    async def _erase_batch(
        self, connection: Any, keys: list[tuple[str, int]], *, dry_run: bool
    ) -> dict[str, int]:
        if not keys:
            return {"updates": 0, "attempts": 0, "events": 0}
        counts = {"updates": len(keys), "attempts": 0, "events": 0}
        # The deliveries beside the rows (revision 0010) go with them: an attempt that holds
        # one loses it as `erase_updates` says; their history counts with the attempts.
        for name, table, count, erase in (
            ("attempts", self.attempts_table, erasures.count_attempts, erasures.erase_attempts),
            (
                "attempts",
                self.delivery_attempts_table,
                erasures.count_attempts,
                erasures.erase_attempts,
            ),
            ("events", self.events_table, erasures.count_events, erasures.erase_events),
            ("deliveries", self.deliveries_table, erasures.count_attempts, erasures.erase_attempts),
        ):
            if table is None:
                continue
            if dry_run:
                found = int((await connection.execute(count(table, keys))).scalar_one())
            else:
                found = (await connection.execute(erase(table, keys))).rowcount
            if name in counts:
                counts[name] += found
        if not dry_run:
            counts["updates"] = (
                await connection.execute(erasures.erase_updates(self.table, keys))
            ).rowcount
        return counts

    async def _finish(self, table: Table, job: Any, held: int, at: int) -> Erasure | None:
        """The job done, with its audit entry (counts, no id) and its erasure.completed (the
        id, for the bot's own systems) in the same transaction."""
        async with self.transaction() as connection:
            statement = erasures.finish(table, erasure_id=job.id, held=held, at=at)
            row = (await connection.execute(statement)).first()
            if row is None:
                return None
            done = _erasure(row)
            if not done.dry_run:
                data: dict[str, Any] = {"bot": done.bot, "kind": done.kind, "erasure": done.id}
                if job.subject_sealed is not None:  # read from the job as taken: now forgotten
                    subject = int(self.codec.open(job.subject_sealed, erasure_at(done.bot)))
                    data[f"{done.kind}_id"] = subject
                counts = {"updates": done.updates, "attempts": done.attempts}
                data |= counts | {"events": done.events}
                await self._emit(connection, [outbox.Made("erasure.completed", at, data)])
                await self._record(
                    connection,
                    at=at,
                    by=done.requested_by,
                    action="erase",
                    target=done.bot,
                    bots=[done.bot],
                    detail={"kind": done.kind, "erasure": done.id},
                    matched=done.updates,
                    changed=done.updates,
                )
        return done

    async def erase_delivered_bodies(
        self, bot: str, *, settled_before: int, at: int, limit: int = ERASE_BATCH
    ) -> int:
        """Retention (a bot's `body_retention`): erase, a bounded batch per transaction, the
        bodies of `bot`'s delivered updates settled at or before `settled_before`, with their
        attempts' errors and their delivered events' data; the rows stay. An update is
        delivered once its row and every delivery beside it (revision 0010) are. The count
        erased."""
        self._erasures("erase_delivered_bodies")  # revision 0009's erased_at, or SchemaError
        bot, at = validate.bot_name(bot), validate.millis("at", at)
        before = validate.millis("settled_before", settled_before)
        limit = validate.positive("limit", limit)
        erased = 0
        while True:
            statement = erasures.erase_bodies(
                self.table,
                self.deliveries_table,
                bot=bot,
                settled_before=before,
                at=at,
                limit=limit,
            )
            async with self.transaction() as connection:
                keys = [(row.bot, row.update_id) for row in await connection.execute(statement)]
                for errors in (
                    self.attempts_table,
                    self.deliveries_table,
                    self.delivery_attempts_table,
                ):
                    if keys and errors is not None:
                        await connection.execute(erasures.erase_errors(errors, keys))
                if keys and self.events_table is not None:
                    await connection.execute(erasures.forget_event_data(self.events_table, keys))
            erased += len(keys)
            if len(keys) < limit:
                return erased


def _erasure(row: Any) -> Erasure:
    return Erasure(
        id=row.id,
        bot=row.bot,
        kind=cast(ErasureKind, row.kind),
        dry_run=bool(row.dry_run),
        state=row.state,
        requested_at=row.requested_at,
        requested_by=row.requested_by,
        finished_at=row.finished_at,
        updates=row.updates,
        attempts=row.attempts,
        events=row.events,
    )
