"""`claim_next_owned` compiled once per shape, for both backends."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from sqlalchemy import BigInteger, Integer, Table, Update, bindparam
from sqlalchemy.sql.expression import ClauseElement

from app.store.claims import statements as claims
from app.store.types import Ordering

Compiled = TypeVar("Compiled")


class ClaimShapes(Generic[Compiled]):
    """`claim_next_owned`'s statement compiled once per shape (table, destination, ordering,
    bots, durable), its
    numbers bound at each run: a dispatcher claims for the same bots over and over, and
    building the chat-ordered statement costs milliseconds of Python, more than the database
    takes to run it. Shapes are few; callers listing ever new bots are not: 64 at most."""

    def __init__(self, compile: Callable[[ClauseElement], Compiled]) -> None:
        self._compile = compile
        self._compiled: dict[tuple[Any, ...], Compiled] = {}

    def get(
        self,
        table: Table,
        *,
        ordering: Ordering,
        bots: list[str] | None,
        durable_exhaustion: bool,
        lateral: bool,
        destination: str | None = None,
        record: Callable[[Update], ClauseElement] = lambda claim: claim,
    ) -> Compiled:
        """The compiled claim of this shape, `record`ed (what the backend adds to it): on the
        deliveries table (revision 0010), one per destination."""
        bots_key = None if bots is None else tuple(bots)
        key = (table.name, destination, ordering, bots_key, durable_exhaustion)
        compiled = self._compiled.get(key)
        if compiled is None:
            if len(self._compiled) >= 64:
                self._compiled.clear()
            claim = claims.claim_next_owned(
                table,
                now=bindparam("now", 0, BigInteger),
                lease_until=bindparam("lease_until", 0, BigInteger),
                max_attempts=bindparam("max_attempts", 0, Integer),
                limit=bindparam("limit", 0, Integer),
                window=bindparam("window", 0, Integer),
                ordering=ordering,
                bots=bots,
                durable_exhaustion=durable_exhaustion,
                lateral=lateral,
                destination=destination,
            )
            compiled = self._compiled[key] = self._compile(record(claim))
        return compiled
