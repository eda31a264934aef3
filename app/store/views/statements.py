"""Every statement of what operators read: one update, counts by bot and state, the search with
its cursor, activity by time slot, and the audit log (within some bots)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    ColumnElement,
    FromClause,
    Select,
    Table,
    and_,
    case,
    exists,
    func,
    literal,
    literal_column,
    select,
    tuple_,
    union_all,
)

from app.store.operator_types import SearchCursor, UpdateFilter
from app.store.predicates import (
    in_state,
    key_is,
    unacknowledged,
)
from app.store.types import DEFAULT_DESTINATION, StoredDelivery


def get_update(t: Table, *, bot: str, update_id: int) -> Select[Any]:
    return select(t).where(key_is(t, bot, update_id))


def deliveries_of(d: Table, *, bot: str, update_id: int) -> Select[Any]:
    """The deliveries beside one update's row (revision 0010), in destination order."""
    return select(d).where(d.c.bot == bot, d.c.update_id == update_id).order_by(d.c.destination)


def stats(t: Table) -> Select[Any]:
    """Per bot and state (on the deliveries table, per bot, destination and state): rows, the
    oldest receipt, and (revision 0002) open exhaustions."""
    keys = [t.c.bot, *([t.c.destination] if "destination" in t.c else []), t.c.state]
    columns: list[Any] = [
        *keys,
        func.count().label("rows"),
        func.min(t.c.received_at).label("oldest"),
    ]
    if "exhausted_at" in t.c:
        open_exhaustion = case((unacknowledged(t), 1), else_=0)
        columns.append(func.sum(open_exhaustion).label("unacknowledged"))
    return select(*columns).group_by(*keys).order_by(*keys)


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
# What a summary takes from the delivery it is seen from (`search_updates`).
DELIVERY_FIELDS = frozenset(StoredDelivery.__dataclass_fields__) - {"destination"}


def search_updates(
    t: Table,
    chosen: UpdateFilter,
    *,
    after: SearchCursor | None,
    limit: int,
    sealed_bodies: bool = False,
    deliveries: Table | None = None,
) -> Select[Any]:
    """Rows matching `chosen`, newest first: (received_at, bot, update_id) descending, after the
    cursor. One branch per bot, each an ordered walk of the index its filters pick
    (`ix_received`, `ix_chat`, `ix_type`) that stops at `limit`, merged: the cost follows the
    page, not the table. With `contains`, `limit` rows are read and each says whether its body
    holds the text (`hit`): the caller pages through a bounded window at a time. With
    `sealed_bodies` (encrypted at rest) the database cannot tell: each row comes with its
    `body` for the caller to open and search.

    Seen from a destination (`chosen.destination`): `default`'s leaves out the rows that are
    `unrouted`; another's joins each row to its delivery there (`deliveries`, by its primary
    key) and takes `state` and the delivery fields from it."""
    seen_from = chosen.destination
    delivery: Table | FromClause = t
    source: FromClause = t
    if seen_from is not None and seen_from != DEFAULT_DESTINATION:
        if deliveries is None:
            raise ValueError("a search by destination needs the deliveries table")
        delivery = deliveries
        source = t.join(
            deliveries,
            and_(
                deliveries.c.bot == t.c.bot,
                deliveries.c.destination == seen_from,
                deliveries.c.update_id == t.c.update_id,
            ),
        )
    branches = []
    for bot in chosen.bots:
        rules: list[ColumnElement[bool]] = [t.c.bot == bot]
        if seen_from == DEFAULT_DESTINATION:
            rules.append(t.c.state != "unrouted")
        if chosen.state is not None:
            rules.append(in_state(delivery.c.state, chosen.state))
        if chosen.chat is not None:
            rules.append(t.c.queue_key == chosen.chat)
        if chosen.update_type is not None:
            rules.append(t.c.update_type == chosen.update_type)
        if chosen.user is not None:  # an id as stored, between the spaces of `subjects`
            rules.append(t.c.subjects.contains(f" {chosen.user} ", autoescape=True))
        if chosen.received_after is not None:
            rules.append(t.c.received_at >= chosen.received_after)
        if chosen.received_before is not None:
            rules.append(t.c.received_at < chosen.received_before)
        if after is not None:
            rules.append(_after(t, bot, after))
        hit = (
            t.c.body.contains(chosen.contains, autoescape=True)
            if chosen.contains is not None and not sealed_bodies
            else literal(True)
        )
        body = [t.c.body] if chosen.contains is not None and sealed_bodies else []
        erased = [t.c.erased_at] if "erased_at" in t.c else []  # revision 0009
        summary = [
            (delivery if name in DELIVERY_FIELDS else t).c[name].label(name) for name in SUMMARY
        ]
        branch = (
            select(*summary, *erased, hit.label("hit"), *body)
            .select_from(source)
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
