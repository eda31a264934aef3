"""Every statement of settling an attempt: one by attempt number (base), one by full identity,
and many in one statement over a batch of identities (each backend feeds the batch its way)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    ColumnElement,
    Integer,
    Table,
    Text,
    Update,
    case,
    exists,
    update,
)
from sqlalchemy.sql.expression import FromClause

from app.store import history
from app.store.predicates import (
    NON_TERMINAL,
    holds_lease,
    in_state,
    live,
    matches,
    owned_by,
    qualified,
    settle_values,
    settled_columns,
)
from app.store.schema_beside import beside_deliveries
from app.store.types import ClaimIdentity, HandedBack, Settlement


def settle(t: Table, *, bot: str, update_id: int, attempt: int, settlement: Settlement) -> Update:
    return (
        update(t)
        .where(holds_lease(t, bot, update_id, attempt, settlement.at))
        .values(settle_values(t, settlement))
        .returning(t.c.state)
    )


def settle_owned(t: Table, *, identity: ClaimIdentity, settlement: Settlement) -> Update:
    return (
        update(t)
        .where(owned_by(t, identity, settlement.at))
        .values(settle_values(t, settlement))
        .returning(t.c.state)
    )


# The columns of a batch of settlements (`settle_many_owned`), as each backend passes them: one
# derived table `batch` of these (PostgreSQL: unnest() of parallel arrays; SQLite: json_each()
# of one JSON array). `outcome` and `status` are for the attempt's history.
SETTLE_COLUMNS = {
    "bot": Text,
    "update_id": BigInteger,
    "attempt": Integer,
    "claim_id": Text,
    "destination": Text,
    "at": BigInteger,
    "state": Text,
    "due_at": BigInteger,
    "settled_at": BigInteger,
    "error": Text,
    "handed_back": Boolean,
    "outcome": Text,
    "status": Integer,
}


def settle_rows(items: Sequence[tuple[ClaimIdentity, Settlement]]) -> list[dict[str, Any]]:
    """The rows of a batch of settlements, one dictionary of SETTLE_COLUMNS each."""
    return [
        {
            "bot": identity.bot,
            "update_id": identity.update_id,
            "attempt": identity.attempt,
            "claim_id": identity.claim_id,
            "destination": identity.destination,
            "at": settlement.at,
            **settled_columns(settlement),
            "handed_back": isinstance(settlement, HandedBack),
            "outcome": history.outcome_of(settlement),
            "status": getattr(settlement, "status", None),
        }
        for identity, settlement in items
    ]


def settle_many_owned(t: Table, batch: FromClause, *only: ColumnElement[bool]) -> Update:
    """A whole batch of settlements in one statement, each row matched on its full identity and
    live lease (the rule of `settle_owned`), for the rows `only` admits too. RETURNING names
    the keys that were settled and, as `waiting`, whether a later update of the same chat is
    still to deliver: a worker then looks for it at once, and otherwise need not look at all."""
    newer = t.alias("newer")
    same = [newer.c.destination == t.c.destination] if beside_deliveries(t) else []
    waiting = exists().where(
        newer.c.bot == t.c.bot,
        *same,
        newer.c.queue_key == t.c.queue_key,
        newer.c.update_id > t.c.update_id,
        in_state(newer.c.state, *NON_TERMINAL),
    )
    exact = batch_matches(t, batch)
    return (
        update(t)
        .where(exact, live(t, batch.c.at), *only)
        .values(
            state=batch.c.state,
            due_at=batch.c.due_at,
            settled_at=batch.c.settled_at,
            # A hand-back keeps the last real error and spends no attempt (settle_values).
            error=case((batch.c.handed_back, t.c.error), else_=batch.c.error),
            uncounted=t.c.uncounted + case((batch.c.handed_back, 1), else_=0),
        )
        .returning(t.c.bot, t.c.update_id, qualified(waiting).label("waiting"))
    )


def batch_matches(t: Table, batch: FromClause) -> ColumnElement[bool]:
    """A batch's rows (bot, update_id, attempt, claim_id, destination) matched on their
    whole identity (`predicates.matches`)."""
    c = batch.c
    return matches(t, c.bot, c.update_id, c.attempt, c.claim_id, c.destination)
