"""Every statement of the minute samples (docs/design.md decision 8)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import (
    Delete,
    Insert,
    Select,
    Table,
    and_,
    delete,
    func,
    select,
)

from app.store.predicates import NON_TERMINAL, Upsert, in_state
from app.store.schema_samples import SAMPLE_COUNTS

# The row that marks a minute's backlog as taken: no bot or destination is named "".
MARKER = ""


def add(samples: Table, upsert: Upsert, rows: Sequence[Mapping[str, Any]]) -> Insert:
    """Insert `rows` (bot, destination, minute and counts), each adding its counts to the row
    already there."""
    insert: Any = upsert(samples)
    statement: Insert = insert.values(list(rows)).on_conflict_do_update(
        index_elements=[samples.c.bot, samples.c.destination, samples.c.minute],
        set_={name: samples.c[name] + insert.excluded[name] for name in SAMPLE_COUNTS},
    )
    return statement


def take_minute(samples: Table, upsert: Upsert, minute: int) -> Insert:
    """The minute's marker, inserted by the first caller alone (RETURNING only then)."""
    insert: Any = upsert(samples)
    marker = insert.values(bot=MARKER, destination=MARKER, minute=minute)
    statement: Insert = marker.on_conflict_do_nothing().returning(samples.c.minute)
    return statement


def backlog(rows: Table, destination: Any) -> Select[Any]:
    """Per bot (and destination, from a deliveries table): the undelivered rows and the
    oldest one's receipt."""
    return (
        select(
            rows.c.bot,
            destination.label("destination"),
            func.count().label("backlog"),
            func.min(rows.c.received_at).label("oldest"),
        )
        .where(in_state(rows.c.state, *NON_TERMINAL))
        .group_by(rows.c.bot, destination)
    )


def set_backlog(samples: Table, upsert: Upsert, rows: Sequence[Mapping[str, Any]]) -> Insert:
    """The minute's backlog of each (bot, destination) of `rows`, counts left as they are."""
    insert: Any = upsert(samples)
    statement: Insert = insert.values(list(rows)).on_conflict_do_update(
        index_elements=[samples.c.bot, samples.c.destination, samples.c.minute],
        set_={
            "backlog": insert.excluded.backlog,
            "oldest_age_ms": insert.excluded.oldest_age_ms,
        },
    )
    return statement


def window(
    samples: Table,
    *,
    bots: Sequence[str],
    since: int,
    until: int,
    destinations: Sequence[str] | None,
) -> Select[Any]:
    """The rows of the window by the primary key, in its order."""
    s = samples.c
    wanted = [s.bot.in_(list(bots)), s.minute >= since, s.minute < until]
    if destinations is not None:
        wanted.append(s.destination.in_(list(destinations)))
    return select(samples).where(and_(*wanted)).order_by(s.bot, s.destination, s.minute)


def prune(samples: Table, before: int) -> Delete:
    return delete(samples).where(samples.c.minute < before)
