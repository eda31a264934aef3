"""The fenced level (revision 0002): every claim mints a claim_id, and every later transition
matches the whole identity `{bot, update_id, attempt, claim_id}` and a live lease."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.store import chat_order, history, queries, validate
from app.store.engine import translated_errors
from app.store.schema import Revision
from app.store.sqlstore.base import BaseMethods
from app.store.sqlstore.core import check_bots, check_identity, check_lease, check_settlement
from app.store.types import (
    Claimed,
    ClaimIdentity,
    Ordering,
    Settlement,
)


class FencedMethods(BaseMethods):
    def __init__(
        self,
        engine: AsyncEngine,
        table: str,
        revision: Revision,
        *,
        history: bool = True,
        worker: str | None = None,
        events: bool = False,
    ) -> None:
        super().__init__(engine, table, revision, history=history, worker=worker, events=events)
        # Per bot filter: the next chat claim's window and the claims left to skip it
        # (chat_order.next_window).
        self._chat_windows: dict[tuple[str, ...] | None, tuple[int, int]] = {}

    async def claim_owned(
        self,
        bot: str,
        update_id: int,
        *,
        now: int,
        lease_until: int,
        max_attempts: int,
        durable_exhaustion: bool = False,
    ) -> ClaimIdentity | None:
        durable = validate.flag("durable_exhaustion", durable_exhaustion)
        self.require("durable" if durable else "fenced", "claim_owned")
        now, lease_until = check_lease(now, lease_until)
        statement = queries.claim_owned(
            self.table,
            bot=validate.bot_name(bot),
            update_id=validate.update_id(update_id),
            now=now,
            lease_until=lease_until,
            max_attempts=validate.attempts("max_attempts", max_attempts),
            durable_exhaustion=durable_exhaustion,
        )
        with translated_errors(self.table.name):
            rows = await self._backend.claim_recorded(statement, now, durable=durable)
        if not rows or rows[0].state != "processing":
            return None
        return ClaimIdentity(bot, update_id, rows[0].attempts, rows[0].claim_id)

    async def claim_next_owned(
        self,
        *,
        now: int,
        lease_until: int,
        max_attempts: int,
        limit: int,
        ordering: Ordering = "chat",
        bots: Sequence[str] | None = None,
        durable_exhaustion: bool = False,
    ) -> list[Claimed]:
        durable = validate.flag("durable_exhaustion", durable_exhaustion)
        self.require("durable" if durable else "fenced", "claim_next_owned")
        now, lease_until = check_lease(now, lease_until)
        if ordering not in ("chat", "none"):
            raise ValueError(f"ordering {ordering!r} is not 'chat' or 'none'")
        names = check_bots(bots)
        if names == []:
            return []
        shape = None if names is None else tuple(names)
        window, heads_first = self._chat_windows.get(shape, (chat_order.WINDOW, 0))
        numbers = {
            "now": now,
            "lease_until": lease_until,
            "max_attempts": validate.attempts("max_attempts", max_attempts),
            "limit": validate.positive("limit", limit),
            "window": window,
        }
        with translated_errors(self.table.name):
            rows = await self._backend.claim_next_owned(
                self.table,
                numbers,
                ordering=ordering,
                bots=names,
                durable_exhaustion=durable_exhaustion,
            )
        if ordering == "chat" and rows:
            if len(self._chat_windows) >= 64:  # filters are few; callers listing new ones are not
                self._chat_windows.clear()
            walked_heads = bool(rows[0].walked_heads)
            self._chat_windows[shape] = chat_order.next_window(window, walked_heads, heads_first)
        claimed = [
            Claimed(
                identity=ClaimIdentity(row.bot, row.update_id, row.attempts, row.claim_id),
                body=row.body,
                update_type=row.update_type,
                queue_key=row.queue_key,
                received_at=row.received_at,
                counted=row.counted,
            )
            for row in rows
            if row.state == "processing"
        ]
        claimed.sort(key=lambda c: (c.identity.bot, c.identity.update_id))
        return claimed

    async def renew_owned(
        self, identity: ClaimIdentity, lease_until: int, now: int | None = None
    ) -> bool:
        return await self.renewed_lease(identity, lease_until, now) is not None

    async def renewed_lease(
        self, identity: ClaimIdentity, lease_until: int, now: int | None = None
    ) -> int | None:
        """`renew_owned`, answering with the lease's expiry after it (epoch ms; a renewal
        never shortens) instead of True."""
        self.require("fenced", "renew_owned")
        statement = queries.renew_owned(
            self.table,
            identity=check_identity(identity),
            lease_until=validate.millis("lease_until", lease_until),
            now=None if now is None else validate.millis("now", now),
        )
        async with self._write() as connection:
            row = (await connection.execute(statement)).first()
        return None if row is None else int(row.due_at)

    async def owns(
        self, identity: ClaimIdentity, at: int, *, connection: AsyncConnection | None = None
    ) -> bool:
        return await self.owned_lease(identity, at, connection=connection) is not None

    async def owned_lease(
        self, identity: ClaimIdentity, at: int, *, connection: AsyncConnection | None = None
    ) -> int | None:
        """`owns`, answering with the lease's expiry (epoch ms) instead of True."""
        self.require("fenced", "owns")
        identity, at = check_identity(identity), validate.millis("at", at)
        if connection is not None:
            # Inside the caller's transaction: hold the row until it commits.
            statement = queries.owns(self.table, identity=identity, at=at, lock=True)
            with translated_errors(self.table.name):
                row = (await connection.execute(statement)).first()
        else:
            # A bare answer: locking would release at once, and only wait behind other holders.
            async with self._read() as own:
                row = await self._backend.owns(own, self.table, identity, at)
        return None if row is None else int(row.due_at)

    async def owned_leases(self, identities: Sequence[ClaimIdentity], at: int) -> list[int | None]:
        self.require("fenced", "owns")
        checked = [check_identity(identity) for identity in identities]
        at = validate.millis("at", at)
        if not checked:
            return []
        async with self._read() as connection:
            leases = await self._backend.owned_leases(connection, self.table, checked, at)
        return [leases.get(identity) for identity in checked]

    async def renewed_leases(
        self, renewals: Sequence[tuple[ClaimIdentity, int]], now: int
    ) -> list[int | None]:
        self.require("fenced", "renew_owned")
        now = validate.millis("now", now)
        latest: dict[ClaimIdentity, int] = {}  # one renewal per identity: the later lease
        for identity, lease_until in renewals:
            identity = check_identity(identity)
            lease_until = validate.millis("lease_until", lease_until)
            latest[identity] = max(lease_until, latest.get(identity, lease_until))
        if not latest:
            return []
        async with self._write() as connection:
            leases = await self._backend.renewed_leases(
                connection, self.table, list(latest.items()), now
            )
        for identity in latest.keys() - leases.keys():  # refused, or its row held: alone
            lease = await self.renewed_lease(identity, latest[identity], now)
            if lease is not None:
                leases[identity] = lease
        return [leases.get(identity) for identity, _ in renewals]

    async def settle_owned(self, identity: ClaimIdentity, settlement: Settlement) -> bool:
        self.require("fenced", "settle_owned")
        identity, settlement = check_identity(identity), check_settlement(settlement)
        statement = queries.settle_owned(self.table, identity=identity, settlement=settlement)
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
        once per batch. `waiting`, when given, receives the settled keys whose chat still has
        a later update to deliver (on SQLite: every settled key, which costs no query and
        misses none)."""
        self.require("fenced", "settle_many_owned")
        checked = [
            (check_identity(identity), check_settlement(settlement))
            for identity, settlement in items
        ]
        keys = [(identity.bot, identity.update_id) for identity, _ in checked]
        if len(set(keys)) != len(keys):
            raise ValueError(f"keys {sorted(k for k in keys if keys.count(k) > 1)} repeat")
        if not checked:
            return []
        with translated_errors(self.table.name):
            settled = await self._backend.settle_many_owned(self.table, checked)
        if waiting is not None:
            waiting.update(key for key, chat_waits in settled.items() if chat_waits)
        outcomes: list[bool | None] = []
        for key in keys:
            if key not in settled:
                outcomes.append(False)  # refused
            else:
                outcomes.append(None if settled[key] is None else True)  # None: row locked
        return outcomes
