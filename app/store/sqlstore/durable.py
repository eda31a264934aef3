"""The durable level (revision 0002): a terminal failure is an exhaustion record that stays until
its exact acknowledgement."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Row

from app.store import events, queries, validate
from app.store.sqlstore.core import check_bots, check_identity, check_lease
from app.store.sqlstore.fenced import FencedMethods
from app.store.types import (
    ClaimIdentity,
    EventType,
    Exhaustion,
)


class DurableMethods(FencedMethods):
    async def exhaust(
        self, identity: ClaimIdentity, at: int, error: str, *, status: int | None = None
    ) -> bool:
        self.require("durable", "exhaust")
        identity, at = check_identity(identity), validate.millis("at", at)
        error, status = validate.text("error", error), validate.status("status", status)
        statement = queries.exhaust(self.table, identity=identity, at=at, error=error)

        def created(row: Row[Any]) -> tuple[EventType, int, dict[str, Any]]:
            data = events.exhaustion(row, error=error, at=at, reason="failed")
            return "exhaustion.created", at, data | {"status_code": status}

        return await self._ended(
            statement,
            identity,
            event=created,
            at=at,
            outcome="exhausted",
            status=status,
            error=error,
        )

    async def due_exhaustions(
        self,
        *,
        limit: int,
        after: tuple[str, int] | None = None,
        bots: Sequence[str] | None = None,
    ) -> list[Exhaustion]:
        self.require("durable", "due_exhaustions")
        if after is not None:
            if not isinstance(after, tuple) or len(after) != 2:
                raise ValueError(f"after {after!r} is not a (bot, update_id) cursor")
            after = (validate.bot_name(after[0]), validate.update_id(after[1]))
        names = check_bots(bots)
        if names == []:
            return []
        statement = queries.due_exhaustions(
            self.table, limit=validate.positive("limit", limit), after=after, bots=names
        )
        async with self._read() as connection:
            rows = (await connection.execute(statement)).all()
        return [exhaustion_of(row) for row in rows]

    async def take_exhaustions(
        self, *, now: int, lease_until: int, limit: int, bots: Sequence[str]
    ) -> list[Exhaustion]:
        self.require("durable", "take_exhaustions")
        now, lease_until = check_lease(now, lease_until)
        names = check_bots(bots)
        if not names:
            return []
        statement = queries.take_exhaustions(
            self.table,
            now=now,
            lease_until=lease_until,
            limit=validate.positive("limit", limit),
            bots=names,
        )
        async with self._write() as connection:
            rows = (await connection.execute(statement)).all()
        return sorted(
            (exhaustion_of(row) for row in rows),
            key=lambda e: (e.identity.bot, e.identity.update_id),
        )

    async def delivery_failed(self, exhaustion: Exhaustion, retry_at: int) -> bool:
        self.require("durable", "delivery_failed")
        if not isinstance(exhaustion, Exhaustion):
            raise ValueError(f"exhaustion {exhaustion!r} is not an Exhaustion")
        statement = queries.delivery_failed(
            self.table,
            identity=check_identity(exhaustion.identity),
            retry_at=validate.millis("retry_at", retry_at),
            deliveries=validate.count("deliveries", exhaustion.deliveries),
        )
        return await self._changed(statement)

    async def acknowledge_exhaustion(self, identity: ClaimIdentity, at: int) -> bool:
        self.require("durable", "acknowledge_exhaustion")
        statement = queries.acknowledge_exhaustion(
            self.table, identity=check_identity(identity), at=validate.millis("at", at)
        )
        return await self._changed(statement)


def exhaustion_of(row: Any) -> Exhaustion:
    return Exhaustion(
        identity=ClaimIdentity(row.bot, row.update_id, row.attempts, row.claim_id),
        body=row.body,
        error=row.error,
        exhausted_at=row.exhausted_at,
        deliveries=row.deliveries,
    )
