"""The rows a chat-ordered `claim_next_owned` takes, found at a cost that no backlog sets.

The rule: a row is eligible when no older row (smaller update_id) of its (bot, queue_key) is
pending, processing or failed; rows without a queue_key always are. The claim takes the
eligible due rows oldest due first, up to its limit.

Two walks find them; the statement runs the second only when the first comes up short:
- the due-order walk: the window of the `window * limit` non-terminal rows due first (ix_due,
  rows due at one instant in the index's order), each tested by one probe of ix_queue for an
  older open row of its chat. While the heads of the chats lie near the front of the queue it
  fills the batch from the window;
- the head walk: a loose index scan of ix_queue, one probe per chat with open rows (the first
  entry after the previous chat's key is the next chat's head), plus the rows without a
  queue_key of each bot. Its cost follows the number of chats and never the rows queued
  behind a head: a chat whose head waits in backoff, or under a live lease, with 100,000 rows
  behind it, costs one probe here, where the due-order walk steps through every one of them.

Both are exact: the oldest due first (rows due at one instant in any order). Every row past
the window is due no earlier than the window's last, so a window that yields `limit` rows
yields oldest ones; the head walk reads every head. Before, the window stopped short of the
instant of its last row, and a backlog due at one instant (a group commit's rows) left it
empty: every claim walked every chat's head.
The statement reports which walk answered (`walked_heads`). Where a blocked chat fills the
front of the queue, every claim would pay for a window that comes up short before the head
walk; so after one that did, a claimer skips the window (`window` 0) for its next
`HEADS_FIRST` claims, then tries it again (`next_window`).

PostgreSQL reads each head with one LATERAL probe and locks the heads one at a time in due
order, skipping rows another claimer holds (SKIP LOCKED, as the due-order walk does). SQLite
has no LATERAL: its probes are scalar subqueries, and its one writer needs no locks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from sqlalchemy import (
    CTE,
    Boolean,
    ColumnElement,
    Select,
    Subquery,
    Table,
    Text,
    exists,
    false,
    func,
    literal,
    literal_column,
    null,
    select,
    true,
    type_coerce,
    union_all,
)

from app.store.claims.queue_index import by_queue_index
from app.store.predicates import NON_TERMINAL, Number, for_destination, in_state, unindexed
from app.store.schema_beside import beside_deliveries

# The due-order walk gives up after this many rows per row wanted (so half of them may be
# held back by their chats and it still fills the batch): past it, reading the heads one
# probe each is the cheaper way, whatever queues behind them. Each row the walk gives up on
# costs about what one head does; a claim that gives up pays both.
WINDOW = 2
# After a window came up short, the claims that go straight to the head walk before the
# window is tried again: a blocked front skips the window's price on all but one claim in
# HEADS_FIRST + 1, and a front that has cleared pays the head walk for at most HEADS_FIRST.
HEADS_FIRST = 8


def next_window(window: int, walked_heads: bool, heads_first: int) -> tuple[int, int]:
    """The window of a claimer's next chat-ordered claim, and its count of claims left to
    take by the head walk alone, after a claim with `window` that took its rows by the head
    walk or not (`walked_heads`) with `heads_first` left."""
    if window and walked_heads:  # the window came up short: skip it for a while
        return 0, HEADS_FIRST
    if heads_first > 1:
        return 0, heads_first - 1
    return WINDOW, 0


# Constants as SQL literals, not bound parameters: a prepared statement's generic plan then
# still sees LIMIT 1.
ONE: ColumnElement[int] = literal_column("1")
ZERO: ColumnElement[int] = literal_column("0")


def due_for_claim(
    state: ColumnElement[str], due_at: ColumnElement[int], now: Number
) -> ColumnElement[bool]:
    """Open, due, and not under a live lease (a lease is live at exactly due_at; a pending
    row is due from receipt, a retry at due_at)."""
    return (
        in_state(state, *NON_TERMINAL)
        & (due_at <= now)
        & (~in_state(state, "processing") | (due_at < now))
    )


def first_of_its_chat(t: Table) -> ColumnElement[bool]:
    """No older row of the same (bot, queue_key) is open (on the deliveries table, of the
    same destination too): the rule itself, one probe of ix_queue per row."""
    older = t.alias("older")
    same = [older.c.destination == t.c.destination] if beside_deliveries(t) else []
    return t.c.queue_key.is_(None) | ~exists().where(
        older.c.bot == t.c.bot,
        *same,
        older.c.queue_key == t.c.queue_key,
        older.c.update_id < t.c.update_id,
        in_state(older.c.state, *NON_TERMINAL),
    )


def chat_ordered(
    t: Table,
    *,
    now: Number,
    limit: Number,
    window: Number,
    bots: Sequence[str] | None,
    lateral: bool,
    destination: str | None = None,
) -> tuple[Select[Any], ColumnElement[bool]]:
    """The keys (bot, update_id) the claim takes: up to `limit` eligible rows, oldest due
    first, and whether the head walk found them. With `lateral` (PostgreSQL) they are locked,
    rows locked elsewhere skipped. `window` 0 goes straight to the head walk. On the
    deliveries table (revision 0010) every walk keeps to `destination`'s rows."""
    mine = partial(for_destination, destination=destination)
    open_rows = in_state(t.c.state, *NON_TERMINAL) & mine(t)
    # The window: the `window * limit` rows due first (any bot's), one more to tell whether
    # rows lie past it, read from ix_due in its order; rows due at one instant come in the
    # index's own order, so that a backlog recorded at one instant (a group commit's rows
    # share their `received_at`) still fills the window rather than none of it.
    window_rows = (
        select(t.c.bot, t.c.update_id)
        .where(open_rows, t.c.due_at <= now)
        .order_by(t.c.due_at)
        .limit(limit * window + ONE)
        .cte("window_rows")
        .prefix_with("MATERIALIZED")
    )
    walked = (
        select(t.c.bot, t.c.update_id)
        .join(
            window_rows,
            (window_rows.c.bot == t.c.bot) & (window_rows.c.update_id == t.c.update_id),
        )
        .where(
            open_rows,
            t.c.due_at <= now,
            ~in_state(t.c.state, "processing") | (t.c.due_at < now),
            mine(t),
            first_of_its_chat(t),
        )
    )
    if bots is not None:
        walked = walked.where(unindexed(t.c.bot).in_(list(bots)))
    early = (
        walked.order_by(t.c.due_at, t.c.bot, t.c.update_id)
        .limit(limit)
        .with_for_update(skip_locked=True, of=t)
        .cte("early")
        .prefix_with("MATERIALIZED")
    )
    taken_early = select(func.count()).select_from(early).scalar_subquery()
    in_window = select(func.count()).select_from(window_rows).scalar_subquery()
    short = (in_window > limit * window) & (taken_early < limit)
    fallback = (
        select(type_coerce(short, Boolean).label("short"))
        .cte("fallback")
        .prefix_with("MATERIALIZED")
    )
    walk = _heads_lateral if lateral else _heads_scalar
    bots_walked = _bots(t, bots, fallback, mine)
    later = walk(t, now=now, limit=limit, bots=bots_walked, mine=mine).subquery("later")
    keys = union_all(
        select(early.c.bot, early.c.update_id).where(~select(fallback.c.short).scalar_subquery()),
        select(later.c.bot, later.c.update_id),
    ).subquery("keys")
    # Selected again: SQLite searches the primary key for an IN over a plain SELECT only.
    walked_heads = type_coerce(select(fallback.c.short).scalar_subquery(), Boolean)
    return select(keys.c.bot, keys.c.update_id), walked_heads


Mine = Callable[[Any], ColumnElement[bool]]  # the rows of the claim's destination


def _bots(t: Table, bots: Sequence[str] | None, fallback: CTE, mine: Mine) -> CTE:
    """The bots to walk: the ones named, or else those with open rows (one probe each, and a
    NULL row last). None at all unless the due-order walk came up short, so that the head
    walk costs nothing when it is not used."""
    if bots is not None:
        named = [
            select(literal(name, Text).label("bot")).select_from(fallback).where(fallback.c.short)
            for name in bots
        ]
        if not named:
            return select(null().label("bot")).where(false()).cte("bots")
        return (named[0] if len(named) == 1 else union_all(*named)).cte("bots")

    def first_after(previous: ColumnElement[str] | None) -> Any:
        rows = by_queue_index(t, "bot_rows")
        first = select(rows.c.bot).where(in_state(rows.c.state, *NON_TERMINAL), mine(rows))
        if previous is not None:
            first = first.where(rows.c.bot > previous)
        # ix_queue's own order: the primary key, also led by bot, walks settled rows too.
        order = (rows.c.bot, rows.c.queue_key, rows.c.update_id)
        return first.order_by(*order).limit(ONE).scalar_subquery()

    found = (
        select(first_after(None).label("bot"))
        .select_from(fallback)
        .where(fallback.c.short)
        .cte("bots", recursive=True)
    )
    previous = found.alias("previous_bot")
    return found.union_all(select(first_after(previous.c.bot)).where(previous.c.bot.is_not(None)))


def _heads_lateral(t: Table, *, now: Number, limit: Number, bots: CTE, mine: Mine) -> Select[Any]:
    """PostgreSQL: each head with one LATERAL probe of ix_queue (it yields the row itself),
    then the eligible rows locked one at a time in due order until `limit` are held."""
    columns = ("bot", "queue_key", "update_id", "state", "due_at")

    def head_after(bot: ColumnElement[str], queue_key: ColumnElement[str] | None) -> Any:
        rows = t.alias("chat_rows")
        after = rows.c.queue_key.is_not(None) if queue_key is None else rows.c.queue_key > queue_key
        return (
            select(*(rows.c[name] for name in columns))
            .where(in_state(rows.c.state, *NON_TERMINAL), rows.c.bot == bot, mine(rows), after)
            .order_by(rows.c.queue_key, rows.c.update_id)
            .limit(ONE)
            .lateral("head")
        )

    bot = bots.alias("open_bot")
    first = head_after(bot.c.bot, None)
    heads = (
        select(*(first.c[name] for name in columns))
        .select_from(bot.join(first, true()))
        .cte("heads", recursive=True)
    )
    previous = heads.alias("previous_head")
    following = head_after(previous.c.bot, previous.c.queue_key)
    heads = heads.union_all(
        select(*(following.c[name] for name in columns)).select_from(
            previous.join(following, true())
        )
    )
    # The rows without a queue_key: up to `limit` of each bot, the oldest due. Found by
    # ix_queue (bot, NULL): `due_at + 0` keeps the planner off the due-order index, whose walk
    # in due order would pass every row of the chats, blocked ones included.
    unqueued_bot = bots.alias("unqueued_bot")
    rows = t.alias("unqueued_rows")
    unqueued_due_at = rows.c.due_at + ZERO
    unqueued = (
        select(rows.c.bot, rows.c.update_id, rows.c.due_at)
        .where(
            rows.c.bot == unqueued_bot.c.bot,
            mine(rows),
            rows.c.queue_key.is_(None),
            due_for_claim(rows.c.state, unqueued_due_at, now),
        )
        .order_by(unqueued_due_at, rows.c.update_id)
        .limit(limit)
        .lateral("unqueued")
    )
    eligible = (
        union_all(
            select(heads.c.bot, heads.c.update_id, heads.c.due_at).where(
                due_for_claim(heads.c.state, heads.c.due_at, now)
            ),
            select(unqueued.c.bot, unqueued.c.update_id, unqueued.c.due_at).select_from(
                unqueued_bot.join(unqueued, true())
            ),
        )
        .order_by("due_at", "bot", "update_id")
        .subquery("eligible")
    )
    # Locked in due order, one LATERAL per row, so that only the rows taken are locked; the
    # lock re-reads the row, and a row another claim took meanwhile no longer qualifies. The
    # candidates arrive in the final order, ties in due_at included: sorted by due_at alone,
    # the final order would need a whole group of ties before the first row, and every row of
    # it would be locked (all 500 heads where every row is due at one instant), leaving the
    # other claimers nothing to take.
    locked = (
        select(t.c.bot, t.c.update_id)
        .where(
            t.c.bot == eligible.c.bot,
            mine(t),
            t.c.update_id == eligible.c.update_id,
            due_for_claim(t.c.state, t.c.due_at, now),
        )
        .with_for_update(skip_locked=True, of=t)
        .lateral("locked")
    )
    return (
        select(locked.c.bot, locked.c.update_id)
        .select_from(eligible.join(locked, true()))
        .order_by(eligible.c.due_at, eligible.c.bot, eligible.c.update_id)
        .limit(limit)
    )


def _heads_scalar(t: Table, *, now: Number, limit: Number, bots: CTE, mine: Mine) -> Select[Any]:
    """SQLite: the chats' keys by one scalar probe each, then each head's update_id and, if
    it is due, its due_at (a probe each); the oldest `limit`."""

    def key_after(bot: ColumnElement[str], queue_key: ColumnElement[str] | None) -> Any:
        rows = by_queue_index(t, "chat_rows")
        after = rows.c.queue_key.is_not(None) if queue_key is None else rows.c.queue_key > queue_key
        return (
            select(rows.c.queue_key)
            .where(in_state(rows.c.state, *NON_TERMINAL), rows.c.bot == bot, mine(rows), after)
            .order_by(rows.c.queue_key, rows.c.update_id)
            .limit(ONE)
            .scalar_subquery()
        )

    bot = bots.alias("open_bot")
    chats = (
        select(bot.c.bot, key_after(bot.c.bot, None).label("queue_key"))
        .where(bot.c.bot.is_not(None))
        .cte("chats", recursive=True)
    )
    previous = chats.alias("previous_chat")
    chats = chats.union_all(
        select(previous.c.bot, key_after(previous.c.bot, previous.c.queue_key)).where(
            previous.c.queue_key.is_not(None)
        )
    )
    head_rows = by_queue_index(t, "head_rows")
    head = (
        select(head_rows.c.update_id)
        .where(
            in_state(head_rows.c.state, *NON_TERMINAL),
            head_rows.c.bot == chats.c.bot,
            mine(head_rows),
            head_rows.c.queue_key == chats.c.queue_key,
        )
        .order_by(head_rows.c.update_id)
        .limit(ONE)
        .scalar_subquery()
    )
    unqueued = by_queue_index(t, "unqueued_rows")
    candidates: Subquery = union_all(
        select(chats.c.bot, head.label("update_id")).where(chats.c.queue_key.is_not(None)),
        select(unqueued.c.bot, unqueued.c.update_id).where(
            in_state(unqueued.c.state, *NON_TERMINAL),
            mine(unqueued),
            unqueued.c.queue_key.is_(None),
            unqueued.c.bot.in_(select(bots.c.bot)),
        ),
    ).subquery("candidates")
    row = t.alias("candidate_row")
    due_at = (
        select(row.c.due_at)
        .where(
            row.c.bot == candidates.c.bot,
            mine(row),
            row.c.update_id == candidates.c.update_id,
            due_for_claim(row.c.state, row.c.due_at, now),
        )
        .scalar_subquery()
    )
    # Materialised, so that each candidate's probe runs once, not again for the ORDER BY.
    ready = (
        select(candidates.c.bot, candidates.c.update_id, due_at.label("due_at"))
        .cte("ready")
        .prefix_with("MATERIALIZED")
    )
    return (
        select(ready.c.bot, ready.c.update_id)
        .where(ready.c.due_at.is_not(None))
        .order_by(ready.c.due_at, ready.c.bot, ready.c.update_id)
        .limit(limit)
    )
