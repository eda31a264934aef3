"""Every statement of operator control (revision 0004's `_bots`, `_audit`): pause and resume,
the rate limiter's shared bucket, the breaker the workers report, park, and the audit entry
every action writes in its own transaction."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from sqlalchemy import (
    ColumnElement,
    Insert,
    Select,
    Table,
    Update,
    and_,
    case,
    exists,
    func,
    insert,
    literal,
    null,
    select,
    update,
)

from app.store.predicates import Upsert, identity_is, in_state, key_is, transition_returning
from app.store.types import DEFAULT_DESTINATION, ClaimIdentity

# The controls of a bot are its row of `_bots` (its pause, and destination `default`'s rate
# limit and breaker); a destination beside `default` has its row of `_destinations` (revision
# 0010), keyed (bot, destination). Every statement below takes either table, and the row's key.


def _key(controls: Table, bot: str, destination: str | None) -> dict[str, Any]:
    """The row's key columns: a destination's only in `_destinations`."""
    if "destination" in controls.c:
        if destination is None:
            raise ValueError("a destination's controls need its name")
        return {"bot": bot, "destination": destination}
    return {"bot": bot}


def _is(controls: Table, bot: str, destination: str | None) -> ColumnElement[bool]:
    return and_(
        *(controls.c[name] == value for name, value in _key(controls, bot, destination).items())
    )


def _upsert(
    bots: Table,
    upsert: Upsert,
    row: dict[str, Any],
    changes: dict[str, Any],
) -> Insert:
    insert = upsert(bots)
    index = [bots.c.bot, *([bots.c.destination] if "destination" in bots.c else [])]
    statement: Insert = insert.values(row).on_conflict_do_update(index_elements=index, set_=changes)
    return statement


def bot_controls(bots: Table, names: Sequence[str] | None) -> Select[Any]:
    """The rows of these bots (every one, with None); in `_destinations`, of each of their
    destinations."""
    keys = [bots.c.bot, *([bots.c.destination] if "destination" in bots.c else [])]
    statement = select(bots).order_by(*keys)
    return statement if names is None else statement.where(bots.c.bot.in_(list(names)))


def pause(
    bots: Table,
    upsert: Upsert,
    *,
    bot: str,
    at: int,
    by: str,
    reason: str | None,
    destination: str | None = None,
) -> Insert:
    """Pause `bot` (or its `destination`) unless it is paused already (a second pause keeps
    the first's time, key and reason); RETURNING its pause, to tell whether this call paused
    it."""
    b = bots.c
    row = {
        **_key(bots, bot, destination),
        "paused_at": at,
        "paused_by": by,
        "paused_reason": reason,
    }
    kept = {
        name: case((b.paused_at.is_(None), literal(value)), else_=b[name])
        for name, value in (("paused_at", at), ("paused_by", by), ("paused_reason", reason))
    }
    return _upsert(bots, upsert, row, kept).returning(b.paused_at, b.paused_by)


def resume(bots: Table, *, bot: str, destination: str | None = None) -> Update:
    b = bots.c
    return (
        update(bots)
        .where(_is(bots, bot, destination), b.paused_at.is_not(None))
        .values(paused_at=None, paused_by=None, paused_reason=None)
        .returning(b.bot)
    )


def set_rate_limit(
    bots: Table,
    upsert: Upsert,
    *,
    bot: str,
    per_second: float | None,
    at: int,
    destination: str | None = None,
) -> Insert:
    """Set (or, with None, lift) the limit; the bucket starts empty at `at`, so a new limit
    never lets a burst through."""
    key = _key(bots, bot, destination)
    row = {**key, "rate_per_second": per_second, "tokens": 0.0, "refilled_at": at}
    changes = {"rate_per_second": per_second, "tokens": 0.0, "refilled_at": at}
    return _upsert(bots, upsert, row, changes).returning(bots.c.bot)


def bucket(bots: Table, *, bot: str, destination: str | None = None) -> Select[Any]:
    """The rate limiter's row, locked for the rest of the transaction (FOR UPDATE on
    PostgreSQL; SQLite's transaction holds the one write lock already)."""
    b = bots.c
    return (
        select(b.rate_per_second, b.tokens, b.refilled_at)
        .where(_is(bots, bot, destination), b.rate_per_second.is_not(None))
        .with_for_update()
    )


def spend_tokens(
    bots: Table, *, bot: str, tokens: float, at: int, destination: str | None = None
) -> Update:
    return update(bots).where(_is(bots, bot, destination)).values(tokens=tokens, refilled_at=at)


def return_tokens(bots: Table, *, bot: str, count: int, destination: str | None = None) -> Update:
    """Give back tokens taken for attempts that did not start (never over a second's worth)."""
    b = bots.c
    full = capacity(bots)
    refunded = b.tokens + count
    return (
        update(bots)
        .where(_is(bots, bot, destination), b.rate_per_second.is_not(None))
        .values(tokens=case((refunded > full, full), else_=refunded))
    )


def capacity(bots: Table) -> ColumnElement[float]:
    """The bucket holds a second's worth of tokens, and never less than one."""
    rate = bots.c.rate_per_second
    return case((rate > 1.0, rate), else_=literal(1.0))


def report_breaker(
    bots: Table,
    upsert: Upsert,
    *,
    bot: str,
    state: str,
    at: int,
    destination: str | None = None,
) -> Insert:
    row = {**_key(bots, bot, destination), "breaker": state, "breaker_at": at}
    return _upsert(bots, upsert, row, {"breaker": state, "breaker_at": at})


def ensure_bot(bots: Table, upsert: Upsert, *, bot: str, destination: str | None = None) -> Insert:
    """The bot's (or destination's) row, made with defaults if it has none (so that it can be
    locked)."""
    insert = upsert(bots)
    key = _key(bots, bot, destination)
    index = [bots.c[name] for name in key]
    statement: Insert = insert.values(key).on_conflict_do_nothing(index_elements=index)
    return statement


def breaker_of(bots: Table, *, bot: str, destination: str | None = None) -> Select[Any]:
    """The shared breaker state, locked for the transaction that changes it."""
    return select(bots.c.breaker).where(_is(bots, bot, destination)).with_for_update()


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


def paused(t: Table, controls: Table) -> ColumnElement[bool]:
    """The row's bot (or on the deliveries table its destination, `controls` then being
    `_destinations`) is paused: no claim may start an attempt for it."""
    b = controls.c
    same = [b.bot == t.c.bot]
    if "destination" in b:
        same.append(b.destination == t.c.destination)
    return select(b.bot).where(*same, b.paused_at.is_not(None)).exists()


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


def update_state(
    t: Table, *, bot: str, update_id: int, destination: str = DEFAULT_DESTINATION
) -> Select[Any]:
    """A delivery's state, attempt and claim (the row's own, or on the deliveries table one
    destination's)."""
    return select(t.c.state, t.c.attempts, t.c.claim_id).where(
        key_is(t, bot, update_id, destination)
    )


# -- replay (revision 0010) -----------------------------------------------------------------


def replayable(
    t: Table, d: Table | None, *, bot: str, destination: str, first: int, last: int
) -> ColumnElement[bool]:
    """The updates of `bot` from `first` to `last` that `destination` never had, their bodies
    kept: for `default` (`d` None), the rows `unrouted`; for another, the rows without a
    delivery to it in `d`."""
    rules = [t.c.bot == bot, t.c.update_id >= first, t.c.update_id <= last]
    if "erased_at" in t.c:  # revision 0009: retention may have erased a body
        rules.append(t.c.erased_at.is_(None))
    if d is None:
        rules.append(t.c.state == "unrouted")
    else:
        delivered = exists().where(
            d.c.bot == t.c.bot, d.c.destination == destination, d.c.update_id == t.c.update_id
        )
        rules.append(~delivered)
    return and_(*rules)


def count(t: Table, rule: ColumnElement[bool]) -> Select[Any]:
    return select(func.count()).select_from(t).where(rule)


def replay(
    t: Table,
    d: Table | None,
    rule: ColumnElement[bool],
    *,
    destination: str,
    ordered: bool,
    at: int,
) -> Insert | Update:
    """Deliver the rows `rule` selects to `destination`, due at `at`: `default`'s rows become
    pending; another's gain a pending delivery each, in its queue unless it is unordered."""
    if d is None:
        return update(t).where(rule).values(state="pending", due_at=at, settled_at=None)
    source = select(
        t.c.bot,
        literal(destination),
        t.c.update_id,
        t.c.queue_key if ordered else null(),
        t.c.received_at,
        literal("pending"),
        literal(0),
        literal(at),
    ).where(rule)
    columns = ["bot", "destination", "update_id", "queue_key", "received_at", "state"]
    return insert(d).from_select([*columns, "attempts", "due_at"], source)
