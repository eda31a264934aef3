"""Every statement of erasure on request (revision 0009, docs/privacy.md). Each builder is
named after the store method that runs it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    Delete,
    Insert,
    Select,
    Table,
    Update,
    and_,
    delete,
    func,
    insert,
    or_,
    select,
    tuple_,
    update,
)
from sqlalchemy.sql.dml import ReturningUpdate

from app.store.predicates import delivering

Key = tuple[str, int]


def request_erasure(
    erasures: Table,
    *,
    bot: str,
    kind: str,
    subject: str | None,
    subject_sealed: str | None,
    dry_run: bool,
    at: int,
    by: str,
) -> Insert:
    """A new job, due at once; RETURNING its id."""
    return (
        insert(erasures)
        .values(
            bot=bot,
            kind=kind,
            subject=subject,
            subject_sealed=subject_sealed,
            dry_run=int(dry_run),
            requested_at=at,
            requested_by=by,
            state="pending",
            due_at=at,
        )
        .returning(erasures.c.id)
    )


def get_erasure(erasures: Table, *, erasure_id: int) -> Select[Any]:
    return select(erasures).where(erasures.c.id == erasure_id)


def take_erasure(erasures: Table, *, now: int, lease_until: int) -> ReturningUpdate[Any]:
    """Lease the oldest unfinished job that no process holds (never held, or its lease
    lapsed) until `lease_until`: one process works on a job at a time."""
    e = erasures.c
    oldest = (
        select(e.id)
        .where(e.state != "done", e.due_at <= now)
        .order_by(e.id)
        .limit(1)
        .scalar_subquery()
    )
    return (
        update(erasures)
        .where(e.id == oldest, e.state != "done", e.due_at <= now)
        .values(state="running", due_at=lease_until)
        .returning(*erasures.c)
    )


def candidates(
    t: Table, *, bot: str, subject: str | None, after: int | None, limit: int
) -> Select[Any]:
    """The next `limit` rows of `bot` after update_id `after` that may concern `subject`, in
    update_id order: those whose subjects name it, and those recorded before revision 0009
    (no subjects yet: the caller opens their bodies); every row for a whole bot (`subject`
    None)."""
    rules = [t.c.bot == bot]
    if after is not None:
        rules.append(t.c.update_id > after)
    if subject is not None:
        named = t.c.subjects.contains(f" {subject} ", autoescape=True)
        rules.append(or_(named, t.c.subjects.is_(None)))
    return (
        select(t.c.bot, t.c.update_id, t.c.subjects, t.c.body)
        .where(*rules)
        .order_by(t.c.update_id)
        .limit(limit)
    )


def _keyed(table: Table, keys: Sequence[Key]) -> Any:
    return tuple_(table.c.bot, table.c.update_id).in_([tuple(key) for key in keys])


def count_attempts(attempts: Table, keys: Sequence[Key]) -> Select[Any]:
    return select(func.count()).select_from(attempts).where(_keyed(attempts, keys))


def count_events(events: Table, keys: Sequence[Key]) -> Select[Any]:
    return select(func.count()).select_from(events).where(_keyed(events, keys))


def erase_attempts(attempts: Table, keys: Sequence[Key]) -> Delete:
    return delete(attempts).where(_keyed(attempts, keys))


def erase_events(events: Table, keys: Sequence[Key]) -> Delete:
    return delete(events).where(_keyed(events, keys))


def erase_updates(t: Table, keys: Sequence[Key]) -> Delete:
    """Delete the rows of `keys`: whatever attempt holds one loses it (its `owns`, renew and
    settle find no row), and no worker claims it again."""
    return delete(t).where(_keyed(t, keys))


def advance(
    erasures: Table,
    *,
    erasure_id: int,
    held: int,
    lease_until: int,
    after: int,
    updates: int,
    attempts: int,
    events: int,
) -> Update:
    """Record a batch done (its counts, the cursor past it) and renew the lease, only while
    this process still holds the job (`held`: its lease as taken or last renewed)."""
    e = erasures.c
    return (
        update(erasures)
        .where(e.id == erasure_id, e.state == "running", e.due_at == held)
        .values(
            after_update_id=after,
            updates=e.updates + updates,
            attempts=e.attempts + attempts,
            events=e.events + events,
            due_at=lease_until,
        )
    )


def finish(erasures: Table, *, erasure_id: int, held: int, at: int) -> ReturningUpdate[Any]:
    """The job done: its counts stay, the id it erased goes."""
    e = erasures.c
    return (
        update(erasures)
        .where(e.id == erasure_id, e.state == "running", e.due_at == held)
        .values(state="done", finished_at=at, due_at=at, subject=None, subject_sealed=None)
        .returning(*erasures.c)
    )


def erase_bodies(
    t: Table, d: Table | None, *, bot: str, settled_before: int, at: int, limit: int
) -> ReturningUpdate[Any]:
    """Erase the bodies (and errors) of up to `limit` delivered updates of `bot` settled at or
    before `settled_before`: completed, abandoned, or exhaustions once acknowledged (an open
    exhaustion keeps its body), and with `d` (revision 0010) unrouted, each with every
    delivery beside it done by then too. The row stays, with its identity, type, times and
    state: a re-post of its update_id is still a duplicate. RETURNING the keys, for their
    history."""
    # Terminal rows keep due_at == settled_at: the (state, due_at) index bounds the walk.
    done = ("completed", "abandoned", "unrouted") if d is not None else ("completed", "abandoned")
    chosen = (
        select(t.c.bot, t.c.update_id)
        .where(
            t.c.bot == bot,
            t.c.state.in_(done),
            t.c.due_at <= settled_before,
            t.c.settled_at <= settled_before,
            t.c.erased_at.is_(None),
            *([] if d is None else [~delivering(t, d, settled_before + 1)]),
        )
        .limit(limit)
    )
    return (
        update(t)
        .where(tuple_(t.c.bot, t.c.update_id).in_(chosen))
        .values(body="", error=None, erased_at=at)
        .returning(t.c.bot, t.c.update_id)
    )


def erase_errors(attempts: Table, keys: Sequence[Key]) -> Update:
    """The errors of these updates' attempts: a downstream's answer may quote its user."""
    return update(attempts).where(_keyed(attempts, keys)).values(error=None)


def forget_event_data(events: Table, keys: Sequence[Key]) -> Update:
    """The delivered events of these updates keep their type and times, not their data."""
    rule = and_(_keyed(events, keys), events.c.delivered_at.is_not(None))
    return update(events).where(rule).values(data="{}")
