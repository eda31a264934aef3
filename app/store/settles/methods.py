"""Settling attempts: by attempt number (base), by full identity, and many in one statement."""

from __future__ import annotations

from collections.abc import Sequence

from app.store import history, validate
from app.store.checks import by_destination, check_identity, check_settlement
from app.store.core import SqlCore
from app.store.settles import statements as settles
from app.store.types import (
    ClaimIdentity,
    Settlement,
)


class SettleMethods(SqlCore):
    async def settle(self, bot: str, update_id: int, attempt: int, settlement: Settlement) -> None:
        statement = settles.settle(
            self.table,
            bot=validate.bot_name(bot),
            update_id=validate.update_id(update_id),
            attempt=validate.attempts("attempt", attempt),
            settlement=self._sealed_settlement(check_settlement(settlement), bot, update_id),
        )
        await self._changed(statement)

    async def settle_owned(self, identity: ClaimIdentity, settlement: Settlement) -> bool:
        self.require("fenced", "settle_owned")
        identity, settlement = check_identity(identity), check_settlement(settlement)
        settlement = self._sealed_settlement(settlement, identity.bot, identity.update_id)
        table = self._delivery_table(identity.destination)
        statement = settles.settle_owned(table, identity=identity, settlement=settlement)
        return await self._ended(
            statement,
            identity,
            at=settlement.at,
            outcome=history.outcome_of(settlement),
            status=getattr(settlement, "status", None),
            error=getattr(settlement, "error", None),
        )

    async def settle_many_owned(
        self,
        items: Sequence[tuple[ClaimIdentity, Settlement]],
        *,
        waiting: set[tuple[str, int]] | None = None,
    ) -> list[bool | None]:
        """`settle_owned` for a batch, in one transaction (one statement on PostgreSQL); for
        each item, whether it took effect, or None when its row was locked by another
        transaction (PostgreSQL): skipped, not waited for, and still owned. A key may appear
        once per batch and destination. `waiting`, when given, receives the settled keys
        (bot, update_id) whose chat still has a later update to deliver to the same
        destination (on SQLite: every settled key, which costs no query and misses none)."""
        self.require("fenced", "settle_many_owned")
        checked = []
        for identity, settlement in items:
            identity = check_identity(identity)
            settlement = check_settlement(settlement)
            checked.append(
                (identity, self._sealed_settlement(settlement, identity.bot, identity.update_id))
            )
        keys = [(i.bot, i.destination, i.update_id) for i, _ in checked]
        if len(set(keys)) != len(keys):
            raise ValueError(f"keys {sorted(k for k in keys if keys.count(k) > 1)} repeat")
        settled: dict[tuple[str, str, int], bool | None] = {}
        for destination, group in by_destination(checked, lambda item: item[0]).items():
            table = self._delivery_table(destination)
            with self._writing():
                found = await self._backend.settle_many_owned(table, group)
            settled.update(((bot, destination, n), says) for (bot, n), says in found.items())
            if waiting is not None:
                waiting.update((bot, n) for (bot, n), chat_waits in found.items() if chat_waits)
        outcomes: list[bool | None] = []
        for key in keys:
            if key not in settled:
                outcomes.append(False)  # refused
            else:
                outcomes.append(None if settled[key] is None else True)  # None: row locked
        return outcomes
