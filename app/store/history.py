"""Attempt history (revision 0004): what a claim starts and a settle ends, in `_attempts`.

Each claim that starts an attempt inserts its row; each statement that ends an attempt (a
settle, an exhaustion, a park) fills in its end. Both run with the transition itself: as a
data-modifying CTE of the same statement on PostgreSQL (`Backend.transition`, the batch
statements), in the same transaction on SQLite. No attempt costs a round trip of its own.

An attempt whose row never ended was cut off: while it is the update's current attempt and
the row is leased it is "running", otherwise its lease lapsed and it is "lost" (`read_end`).
A key recorded again after a prune restarts at attempt 1: the prune deleted the old history
with the row, and an insert over a leftover row replaces it, so a claim never fails on one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    CTE,
    ColumnElement,
    Delete,
    Insert,
    Select,
    Table,
    Update,
    delete,
    select,
    tuple_,
    update,
)
from sqlalchemy.sql.expression import FromClause

from app.store.operator_types import AttemptEnd
from app.store.predicates import Upsert
from app.store.types import (
    DEFAULT_DESTINATION,
    Abandoned,
    ClaimIdentity,
    Completed,
    Failed,
    HandedBack,
    Settlement,
)

MAX_ERROR_CHARS = 500  # the excerpt of an attempt's error its history keeps


def outcome_of(settlement: Settlement) -> AttemptEnd:
    match settlement:
        case Completed():
            return "completed"
        case Failed():
            return "failed"
        case Abandoned():
            return "abandoned"
        case HandedBack():
            return "handed_back"
    raise TypeError(f"not a settlement: {settlement!r}")


def excerpt(error: str | None) -> str | None:
    return None if error is None else error[:MAX_ERROR_CHARS]


def _replacing(insert: Any) -> Insert:
    """Over a leftover row of the same attempt number (its update was deleted by other means
    than prune, then recorded again), the new attempt replaces it: a claim never fails on one."""
    fresh = insert.excluded
    replaced = {
        "claim_id": fresh.claim_id,
        "started_at": fresh.started_at,
        "worker": fresh.worker,
        "ended_at": None,
        "outcome": None,
        "status_code": None,
        "error": None,
    }
    a = insert.table.c
    key = [a.bot, *_destination(insert.table), a.update_id, a.attempt]
    statement: Insert = insert.on_conflict_do_update(index_elements=key, set_=replaced)
    return statement


def started(attempts: Table, claimed: CTE, *, now: Any, worker: Any, upsert: Upsert) -> Insert:
    """Insert the attempts a claim started: the rows of `claimed` (a claim's RETURNING:
    bot, update_id, attempts, claim_id, state) that it leased."""
    c = claimed.c
    beside = [c.destination] if _destination(attempts) else []
    source = select(c.bot, c.update_id, c.attempts, c.claim_id, now, worker, *beside).where(
        c.state == "processing"
    )
    insert = upsert(attempts).from_select(STARTED + ["destination"] * len(beside), source)
    return _replacing(insert)


STARTED = ["bot", "update_id", "attempt", "claim_id", "started_at", "worker"]


def start_rows(rows: Sequence[Any], *, now: int, worker: str | None) -> list[dict[str, Any]]:
    """The `_attempts` rows of a claim's returned rows, for `insert_started` (on the
    deliveries table, with each row's destination)."""
    return [
        {
            **dict(
                zip(
                    STARTED,
                    (row.bot, row.update_id, row.attempts, row.claim_id, now, worker),
                    strict=True,
                )
            ),
            **({"destination": row.destination} if hasattr(row, "destination") else {}),
        }
        for row in rows
        if row.state == "processing"
    ]


def _destination(attempts: Table) -> list[Any]:
    """The history's destination column: `_delivery_attempts` (revision 0010) has one."""
    return [attempts.c.destination] if "destination" in attempts.c else []


def insert_started(attempts: Table, upsert: Upsert) -> Insert:
    """The insert of `start_rows`, run as an executemany in the claim's transaction."""
    return _replacing(upsert(attempts))


def ended(
    attempts: Table,
    identity: ClaimIdentity,
    *,
    at: int,
    outcome: AttemptEnd,
    status: int | None = None,
    error: str | None = None,
) -> Update:
    """End the attempt of `identity` in its history (once: an ended attempt keeps its end).
    `error` as stored: the store's `_sealed_error` has cut it to its excerpt and sealed it."""
    a = attempts.c
    return (
        update(attempts)
        .where(
            a.bot == identity.bot,
            *(column == identity.destination for column in _destination(attempts)),
            a.update_id == identity.update_id,
            a.attempt == identity.attempt,
            a.claim_id == identity.claim_id,
            a.ended_at.is_(None),
        )
        .values(ended_at=at, outcome=outcome, status_code=status, error=error)
    )


def ended_by_settle(attempts: Table, identity: ClaimIdentity, settlement: Settlement) -> Update:
    return ended(
        attempts,
        identity,
        at=settlement.at,
        outcome=outcome_of(settlement),
        status=getattr(settlement, "status", None),
        error=getattr(settlement, "error", None),
    )


def ended_many(attempts: Table, batch: FromClause, *only: ColumnElement[bool]) -> Update:
    """End in their history the attempts of a batch of settlements (`batch`, the derived table
    of `settles.statements.settle_many_owned`) that `only` admits: the settled ones."""
    a = attempts.c
    return (
        update(attempts)
        .where(
            a.bot == batch.c.bot,
            *(column == batch.c.destination for column in _destination(attempts)),
            a.update_id == batch.c.update_id,
            a.attempt == batch.c.attempt,
            a.claim_id == batch.c.claim_id,
            a.ended_at.is_(None),
            *only,
        )
        .values(
            ended_at=batch.c.at,
            outcome=batch.c.outcome,
            status_code=batch.c.status,
            error=batch.c.error,  # as stored: cut to its excerpt, then sealed
        )
    )


def of_update(
    attempts: Table, *, bot: str, update_id: int, destination: str = DEFAULT_DESTINATION
) -> Select[Any]:
    """One delivery's attempts, oldest first (`_delivery_attempts`: of `destination`)."""
    return (
        select(attempts)
        .where(
            attempts.c.bot == bot,
            *(column == destination for column in _destination(attempts)),
            attempts.c.update_id == update_id,
        )
        .order_by(attempts.c.attempt)
    )


def forget(attempts: Table, keys: CTE) -> Delete:
    """Delete the history of the updates whose keys (bot, update_id) `keys` selects."""
    k = keys.c
    return delete(attempts).where(
        tuple_(attempts.c.bot, attempts.c.update_id).in_(select(k.bot, k.update_id))
    )


def read_end(row: Any, *, current_attempt: int, leased: bool) -> AttemptEnd:
    """An attempt's outcome as a reader sees it (see the module docstring)."""
    if row.outcome is not None:
        return row.outcome  # type: ignore[no-any-return]
    if row.attempt == current_attempt and leased:
        return "running"
    return "lost"
