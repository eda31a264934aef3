"""The outbox of operational events (revision 0004's `_events`): what a transaction that makes
an event writes, and the body `operations_url` receives. Their delivery is
`app.store.events`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple

from sqlalchemy import Insert, Table, Text, cast, func, insert, literal, select
from sqlalchemy.sql.expression import CTE

from app.store.codec import PLAIN, Codec, event_at
from app.store.operator_types import EventType
from app.store.predicates import SPENT_ERROR


def envelope(kind: str, at: int, data: str) -> str:
    """The body `operations_url` receives, Standard Webhooks' recommended shape: the type,
    when it happened (ISO 8601, UTC) and the event's own fields. The same for every delivery."""
    timestamp = datetime.fromtimestamp(at / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")
    head = json.dumps({"type": kind, "timestamp": timestamp[:-3] + "Z"})
    return f'{head[:-1]}, "data": {data}}}'


class Made(NamedTuple):
    """An event a transaction makes: its type, when (epoch ms), its own fields, and the trace
    of the update it tells of (revision 0008; exhaustion.created), when that update has one."""

    type: EventType
    at: int
    data: dict[str, Any]
    trace_context: str | None = None
    # The update it tells of (bot, update_id): erasing the update erases the event (0009).
    update: tuple[str, int] | None = None


def record(events: Table, made: Sequence[Made], codec: Codec = PLAIN) -> Insert:
    """New events, each due for delivery at once; their data sealed (an exhaustion's error may
    echo a user's words), bound to the event's type and time (`opened_data` reads it)."""
    traced = "trace_context" in events.c  # revision 0008
    keyed = "update_id" in events.c  # revision 0009
    rows = [
        {
            "type": event.type,
            "data": codec.seal(json.dumps(event.data), event_at(event.type, event.at)),
            "created_at": event.at,
            "due_at": event.at,
            **({"trace_context": event.trace_context} if traced else {}),
            **(_update_columns(event) if keyed else {}),
        }
        for event in made
    ]
    return insert(events).values(rows)


def _update_columns(event: Made) -> dict[str, Any]:
    bot, update_id = event.update or (None, None)
    return {"bot": bot, "update_id": update_id}


def opened_data(row: Any, codec: Codec) -> str:
    """A read event's data (type, created_at, data) as `record` was given it."""
    return codec.open(row.data, event_at(row.type, row.created_at))


# The fields of exhaustion.created, as both the store's methods and a claim's own statement
# write them.
EXHAUSTION_FIELDS = (
    "bot", "update_id", "attempt", "claim_id", "update_type", "chat", "error", "exhausted_at",
    "reason",
)  # fmt: skip


def exhaustion(row: Any, *, error: str, at: int, reason: str, **more: Any) -> Made:
    """exhaustion.created for a row the transition returned (bot, update_id, attempts,
    claim_id, update_type, queue_key, and its trace_context from revision 0007; a delivery
    beside the row also its destination), with `more` fields beside the common ones."""
    values = (
        row.bot, row.update_id, row.attempts, row.claim_id, row.update_type, row.queue_key,
        error, at, reason,
    )  # fmt: skip
    data = dict(zip(EXHAUSTION_FIELDS, values, strict=True)) | more
    destination = getattr(row, "destination", None)  # a delivery beside the row (0010)
    if destination is not None:
        data["destination"] = destination
    trace = getattr(row, "trace_context", None)
    return Made("exhaustion.created", at, data, trace, (row.bot, row.update_id))


def spent_rows(rows: Sequence[Any], *, now: int) -> list[Made]:
    """exhaustion.created for every row a claim ended because its attempts were spent."""
    return [
        exhaustion(row, error=SPENT_ERROR, at=now, reason="spent")
        for row in rows
        if row.state == "abandoned"
    ]


def spent_in_claim(events: Table, claimed: CTE, *, now: Any) -> Insert:
    """exhaustion.created for every row a claim's own statement ended because its attempts
    were spent (PostgreSQL: a data-modifying CTE of the claim, so both commit together)."""
    c = claimed.c
    values = (
        c.bot, c.update_id, c.attempts, c.claim_id, c.update_type, c.queue_key,
        literal(SPENT_ERROR), now, literal("spent"),
    )  # fmt: skip
    pairs = [part for name, value in zip(EXHAUSTION_FIELDS, values, strict=True)
             for part in (literal(name), value)]  # fmt: skip
    if "destination" in c:  # a delivery beside the row (revision 0010), as `exhaustion` says
        pairs += [literal("destination"), c.destination]
    data = cast(func.json_build_object(*pairs), Text)
    columns = [literal("exhaustion.created"), data, now, now]
    names = ["type", "data", "created_at", "due_at"]
    if "trace_context" in events.c and "trace_context" in c:  # revisions 0008 and 0007
        columns.append(c.trace_context)
        names.append("trace_context")
    if "update_id" in events.c:  # revision 0009
        columns += [c.bot, c.update_id]
        names += ["bot", "update_id"]
    source = select(*columns).where(c.state == "abandoned")
    return insert(events).from_select(names, source)
