"""Every statement of operator control (docs/contract.md section 9, revision 0004), one builder per
store method, named after it: bot controls and the rate limiter's bucket (`_bots`), bulk redrive and
acknowledgement of exhaustions, park, search, attempt history reads and the audit log.

Like `app.store.queries`, each transition is one conditional statement whose WHERE clause is
its whole rule; a bulk action takes its rows in bounded batches in key order, each batch one
statement in its own transaction, so no action holds the table (or SQLite's one write lock)
for long, whatever it matches.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Insert,
    Select,
    Table,
    Update,
    and_,
    case,
    cast,
    exists,
    false,
    func,
    insert,
    literal,
    literal_column,
    or_,
    select,
    tuple_,
    union_all,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite

from app.store.predicates import identity_is, in_state, transition_returning, unacknowledged
from app.store.types import ClaimIdentity, ExhaustionFilter, SearchCursor, UpdateFilter

# -- bot controls --------------------------------------------------------------------------------


def _upsert(bots: Table, dialect: str, row: dict[str, Any], changes: dict[str, Any]) -> Insert:
    insert = postgresql.insert(bots) if dialect == "postgresql" else sqlite.insert(bots)
    statement: Insert = insert.values(row).on_conflict_do_update(
        index_elements=[bots.c.bot], set_=changes
    )
    return statement


def bot_controls(bots: Table, names: Sequence[str] | None) -> Select[Any]:
    statement = select(bots).order_by(bots.c.bot)
    return statement if names is None else statement.where(bots.c.bot.in_(list(names)))


def pause(bots: Table, dialect: str, *, bot: str, at: int, by: str, reason: str | None) -> Insert:
    """Pause `bot` unless it is paused already (a second pause keeps the first's time, key and
    reason); RETURNING its pause, to tell whether this call paused it."""
    b = bots.c
    row = {"bot": bot, "paused_at": at, "paused_by": by, "paused_reason": reason}
    kept = {
        name: case((b.paused_at.is_(None), literal(value)), else_=b[name])
        for name, value in (("paused_at", at), ("paused_by", by), ("paused_reason", reason))
    }
    return _upsert(bots, dialect, row, kept).returning(b.paused_at, b.paused_by)


def resume(bots: Table, *, bot: str) -> Update:
    b = bots.c
    return (
        update(bots)
        .where(b.bot == bot, b.paused_at.is_not(None))
        .values(paused_at=None, paused_by=None, paused_reason=None)
        .returning(b.bot)
    )


def set_rate_limit(
    bots: Table, dialect: str, *, bot: str, per_second: float | None, at: int
) -> Insert:
    """Set (or, with None, lift) the limit; the bucket starts empty at `at`, so a new limit
    never lets a burst through."""
    row = {"bot": bot, "rate_per_second": per_second, "tokens": 0.0, "refilled_at": at}
    changes = {"rate_per_second": per_second, "tokens": 0.0, "refilled_at": at}
    return _upsert(bots, dialect, row, changes).returning(bots.c.bot)


def bucket(bots: Table, *, bot: str) -> Select[Any]:
    """The rate limiter's row, locked for the rest of the transaction (FOR UPDATE on
    PostgreSQL; SQLite's transaction holds the one write lock already)."""
    b = bots.c
    return (
        select(b.rate_per_second, b.tokens, b.refilled_at)
        .where(b.bot == bot, b.rate_per_second.is_not(None))
        .with_for_update()
    )


def spend_tokens(bots: Table, *, bot: str, tokens: float, at: int) -> Update:
    return update(bots).where(bots.c.bot == bot).values(tokens=tokens, refilled_at=at)


def return_tokens(bots: Table, *, bot: str, count: int) -> Update:
    """Give back tokens taken for attempts that did not start (never over a second's worth)."""
    b = bots.c
    full = capacity(bots)
    refunded = b.tokens + count
    return (
        update(bots)
        .where(b.bot == bot, b.rate_per_second.is_not(None))
        .values(tokens=case((refunded > full, full), else_=refunded))
    )


def capacity(bots: Table) -> ColumnElement[float]:
    """The bucket holds a second's worth of tokens, and never less than one."""
    rate = bots.c.rate_per_second
    return case((rate > 1.0, rate), else_=literal(1.0))


def report_breaker(bots: Table, dialect: str, *, bot: str, state: str, at: int) -> Insert:
    row = {"bot": bot, "breaker": state, "breaker_at": at}
    return _upsert(bots, dialect, row, {"breaker": state, "breaker_at": at})


def ensure_bot(bots: Table, dialect: str, *, bot: str) -> Insert:
    """The bot's row, made with defaults if it has none (so that it can be locked)."""
    insert = postgresql.insert(bots) if dialect == "postgresql" else sqlite.insert(bots)
    statement: Insert = insert.values(bot=bot).on_conflict_do_nothing(index_elements=[bots.c.bot])
    return statement


def breaker_of(bots: Table, *, bot: str) -> Select[Any]:
    """The shared breaker state, locked for the transaction that changes it."""
    return select(bots.c.breaker).where(bots.c.bot == bot).with_for_update()


def breaker_event(
    before: str | None, after: str
) -> Literal["breaker.opened", "breaker.closed"] | None:
    """The event a change of the shared breaker state makes, if any: half-open is a probe
    within an open episode, not an episode of its own."""
    was_open = before in ("open", "half_open")
    if after == "open" and not was_open:
        return "breaker.opened"
    if after == "closed" and was_open:
        return "breaker.closed"
    return None


def paused(t: Table, bots: Table) -> ColumnElement[bool]:
    """The row's bot is paused: no claim may start an attempt for it."""
    b = bots.c
    return select(b.bot).where(b.bot == t.c.bot, b.paused_at.is_not(None)).exists()


# -- exhaustions in bulk ---------------------------------------------------------------------


def exhaustions_matching(t: Table, chosen: ExhaustionFilter) -> ColumnElement[bool]:
    """The open exhaustions a filter selects (every criterion given must hold)."""
    rules: list[ColumnElement[bool]] = [unacknowledged(t)]
    if chosen.bots is not None:
        rules.append(t.c.bot.in_(list(chosen.bots)) if chosen.bots else false())
    if chosen.update_type is not None:
        rules.append(t.c.update_type == chosen.update_type)
    if chosen.chat is not None:
        rules.append(t.c.queue_key == chosen.chat)
    if chosen.error_contains is not None:
        rules.append(t.c.error.contains(chosen.error_contains, autoescape=True))
    if chosen.exhausted_after is not None:
        rules.append(t.c.exhausted_at >= chosen.exhausted_after)
    if chosen.exhausted_before is not None:
        rules.append(t.c.exhausted_at < chosen.exhausted_before)
    return and_(*rules)


def exhaustions_exactly(t: Table, identities: Sequence[ClaimIdentity]) -> ColumnElement[bool]:
    """The open exhaustions that hold exactly one of these identities."""
    if not identities:
        return false()
    return and_(unacknowledged(t), or_(*(identity_is(t, identity) for identity in identities)))


def count_exhaustions(t: Table, rule: ColumnElement[bool]) -> Select[Any]:
    return select(func.count()).select_from(t).where(rule)


def sample_exhaustions(t: Table, rule: ColumnElement[bool], *, limit: int) -> Select[Any]:
    return (
        select(t.c.bot, t.c.update_id, t.c.attempts, t.c.claim_id, t.c.body, t.c.error)
        .add_columns(t.c.exhausted_at, t.c.deliveries)
        .where(rule)
        .order_by(t.c.bot, t.c.update_id)
        .limit(limit)
    )


def _batch(t: Table, rule: ColumnElement[bool], after: tuple[str, int] | None, limit: int) -> Any:
    """The next `limit` keys the rule selects after the cursor, in key order, numbered."""
    statement = select(
        t.c.bot,
        t.c.update_id,
        func.row_number().over(order_by=(t.c.bot, t.c.update_id)).label("position"),
    ).where(rule)
    if after is not None:
        statement = statement.where(tuple_(t.c.bot, t.c.update_id) > tuple_(*after))
    return statement.order_by(t.c.bot, t.c.update_id).limit(limit).subquery("batch")


def redrive(
    t: Table,
    rule: ColumnElement[bool],
    *,
    after: tuple[str, int] | None,
    limit: int,
    start: int,
    interval_ms: float,
) -> Update:
    """Redrive the next batch: each open exhaustion becomes a retry due at `start` plus its
    place in the redrive times `interval_ms` (the pacing), with a fresh budget (`uncounted`
    takes every attempt so far) and its attempt numbers continuing, so no earlier identity
    matches again. It stops being an exhaustion (its record is its history and the audit
    log); its error stays until the next attempt's. RETURNING the keys, for the cursor."""
    batch = _batch(t, rule, after, limit)
    offset = cast(func.floor((batch.c.position - 1) * literal(interval_ms)), BigInteger)
    return (
        update(t)
        .where(t.c.bot == batch.c.bot, t.c.update_id == batch.c.update_id, unacknowledged(t))
        .values(
            state="failed",
            due_at=start + offset,
            settled_at=None,
            exhausted_at=None,
            acknowledged_at=None,
            delivery_due_at=None,
            deliveries=0,
            uncounted=t.c.attempts,
        )
        .returning(t.c.bot, t.c.update_id)
    )


def acknowledge_exhaustions(
    t: Table, rule: ColumnElement[bool], *, after: tuple[str, int] | None, limit: int, at: int
) -> Update:
    """Acknowledge the next batch (as `queries.acknowledge_exhaustion` does one): prunable from
    now on, settled at `at`."""
    batch = _batch(t, rule, after, limit)
    return (
        update(t)
        .where(t.c.bot == batch.c.bot, t.c.update_id == batch.c.update_id, unacknowledged(t))
        .values(acknowledged_at=at, settled_at=at, due_at=at)
        .returning(t.c.bot, t.c.update_id)
    )


def park(t: Table, *, identity: ClaimIdentity, at: int, reason: str) -> Update:
    """End the attempt of `identity`, leased (live or lapsed) or waiting for its retry, as an
    exhaustion: terminal, so its chat moves on; kept until acknowledged, delivered to
    exhaustion_url like any other. A live attempt's late settle finds no lease to match."""
    return (
        update(t)
        .where(identity_is(t, identity), in_state(t.c.state, "processing", "failed"))
        .values(
            state="abandoned",
            exhausted_at=at,
            due_at=at,
            settled_at=None,
            error=f"parked: {reason}",
            delivery_due_at=at,
        )
        .returning(*transition_returning(t))
    )


# -- search ------------------------------------------------------------------------------------

SUMMARY = (
    "bot",
    "update_id",
    "state",
    "attempts",
    "update_type",
    "queue_key",
    "received_at",
    "due_at",
    "settled_at",
    "error",
    "claim_id",
    "exhausted_at",
    "acknowledged_at",
)


def search_updates(
    t: Table, chosen: UpdateFilter, *, after: SearchCursor | None, limit: int
) -> Select[Any]:
    """Rows matching `chosen`, newest first: (received_at, bot, update_id) descending, after the
    cursor. One branch per bot, each an ordered walk of the index its filters pick
    (`ix_received`, `ix_chat`, `ix_type`) that stops at `limit`, merged: the cost follows the
    page, not the table. With `contains`, `limit` rows are read and each says whether its body
    holds the text (`hit`): the caller pages through a bounded window at a time."""
    branches = []
    for bot in chosen.bots:
        rules: list[ColumnElement[bool]] = [t.c.bot == bot]
        if chosen.state is not None:
            rules.append(in_state(t.c.state, chosen.state))
        if chosen.chat is not None:
            rules.append(t.c.queue_key == chosen.chat)
        if chosen.update_type is not None:
            rules.append(t.c.update_type == chosen.update_type)
        if chosen.received_after is not None:
            rules.append(t.c.received_at >= chosen.received_after)
        if chosen.received_before is not None:
            rules.append(t.c.received_at < chosen.received_before)
        if after is not None:
            rules.append(_after(t, bot, after))
        hit = (
            t.c.body.contains(chosen.contains, autoescape=True)
            if chosen.contains is not None
            else literal(True)
        )
        branch = (
            select(*(t.c[name] for name in SUMMARY), hit.label("hit"))
            .where(*rules)
            .order_by(t.c.received_at.desc(), t.c.update_id.desc())
            .limit(limit)
        )
        branches.append(branch.subquery().select())
    merged = (
        union_all(*branches).subquery("found")
        if len(branches) > 1
        else branches[0].subquery("found")
    )
    return (
        select(merged)
        .order_by(merged.c.received_at.desc(), merged.c.bot.desc(), merged.c.update_id.desc())
        .limit(limit)
    )


def activity(t: Table, *, bots: Sequence[str], since: int, slot_ms: int) -> Any:
    """Per bot and slot of `slot_ms` from `since`: rows received (a range of `ix_received`) and
    rows completed (a range of `ix_state_due`: a terminal row's due_at is its settlement)."""
    names = list(bots)
    received = (
        select(
            t.c.bot,
            ((t.c.received_at - since) // slot_ms).label("slot"),
            func.count().label("received"),
            literal(0).label("delivered"),
        )
        .where(t.c.bot.in_(names), t.c.received_at >= since)
        .group_by(t.c.bot, literal_column("slot"))
    )
    delivered = (
        select(
            t.c.bot,
            ((t.c.due_at - since) // slot_ms).label("slot"),
            literal(0).label("received"),
            func.count().label("delivered"),
        )
        .where(in_state(t.c.state, "completed"), t.c.due_at >= since, t.c.bot.in_(names))
        .group_by(t.c.bot, literal_column("slot"))
    )
    return union_all(received, delivered)


def _after(t: Table, bot: str, cursor: SearchCursor) -> ColumnElement[bool]:
    """Rows of `bot` after the cursor in the order (received_at, bot, update_id) descending."""
    received_at, last_bot, update_id = cursor
    if bot < last_bot:
        return t.c.received_at <= received_at
    if bot > last_bot:
        return t.c.received_at < received_at
    return tuple_(t.c.received_at, t.c.update_id) < tuple_(received_at, update_id)


# -- history and audit -------------------------------------------------------------------------


def update_state(t: Table, *, bot: str, update_id: int) -> Select[Any]:
    return select(t.c.state, t.c.attempts, t.c.claim_id).where(
        t.c.bot == bot, t.c.update_id == update_id
    )


def record_action(audit: Table, **values: Any) -> Insert:
    return insert(audit).values(**values).returning(audit.c.id)


def record_action_bots(audit_bots: Table, audit_id: int, bots: Sequence[str]) -> Insert:
    return insert(audit_bots).values([{"audit_id": audit_id, "bot": bot} for bot in bots])


def audit_log(
    audit: Table,
    audit_bots: Table | None,
    *,
    after: int | None,
    limit: int,
    bots: Sequence[str] | None,
) -> Select[Any]:
    """Newest first; `after` is the id the previous page ended at. With `bots`, only the
    entries that concern some bot and no bot outside them: an entry of several bots is shown
    only to a key that may see all of them, and one of every bot (a filter that named none)
    only to a key of every bot."""
    statement = select(audit).order_by(audit.c.id.desc()).limit(limit)
    if after is not None:
        statement = statement.where(audit.c.id < after)
    if bots is None:
        return statement
    assert audit_bots is not None, "the store checks for revision 0005"
    concerned = audit_bots.c.audit_id == audit.c.id
    outside = exists().where(concerned, audit_bots.c.bot.not_in(list(bots)))
    return statement.where(exists().where(concerned), ~outside)
