"""Claiming: by key and by batch (every claim of the fenced level mints a claim_id), renewing,
the due rows, and `owns`, the write authority's answer for one exact identity."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.ext.asyncio import AsyncConnection

from app.store import validate
from app.store.checks import by_destination, check_bots, check_identity, check_lease
from app.store.claims import chat_order
from app.store.claims import statements as claims
from app.store.core import SqlCore
from app.store.errors import translated_errors
from app.store.types import (
    DEFAULT_DESTINATION,
    Claimed,
    ClaimIdentity,
    DueUpdate,
    Ordering,
)


class ClaimMethods(SqlCore):
    async def claim(
        self,
        bot: str,
        update_id: int,
        *,
        now: int,
        lease_until: int,
        max_attempts: int,
        durable_exhaustion: bool = False,
    ) -> int | None:
        if validate.flag("durable_exhaustion", durable_exhaustion):
            self.require("durable", "claim(durable_exhaustion=True)")
        now, lease_until = check_lease(now, lease_until)
        statement = claims.claim(
            self.table,
            bot=validate.bot_name(bot),
            update_id=validate.update_id(update_id),
            now=now,
            lease_until=lease_until,
            max_attempts=validate.attempts("max_attempts", max_attempts),
            durable_exhaustion=durable_exhaustion,
        )
        async with self._write() as connection:
            row = (await connection.execute(statement)).first()
        return int(row.attempts) if row is not None and row.state == "processing" else None

    async def renew(
        self, bot: str, update_id: int, attempt: int, lease_until: int, now: int | None = None
    ) -> bool:
        statement = claims.renew(
            self.table,
            bot=validate.bot_name(bot),
            update_id=validate.update_id(update_id),
            attempt=validate.attempts("attempt", attempt),
            lease_until=validate.millis("lease_until", lease_until),
            now=None if now is None else validate.millis("now", now),
        )
        return await self._changed(statement)

    async def due(
        self,
        *,
        now: int,
        pending_before: int,
        limit: int,
        bots: Sequence[str] | None = None,
    ) -> list[DueUpdate]:
        names = check_bots(bots)
        if names == []:
            return []
        statement = claims.due(
            self.table,
            now=validate.millis("now", now),
            pending_before=validate.millis("pending_before", pending_before),
            limit=validate.positive("limit", limit),
            bots=names,
        )
        async with self._read() as connection:
            rows = (await connection.execute(statement)).all()
        return [
            DueUpdate(row.bot, row.update_id, body, row.update_type, row.received_at, unreadable)
            for row in rows
            for body, unreadable in (self._body_or_why(row),)
        ]

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
        statement = claims.claim_owned(
            self.table,
            bot=validate.bot_name(bot),
            update_id=validate.update_id(update_id),
            now=now,
            lease_until=lease_until,
            max_attempts=validate.attempts("max_attempts", max_attempts),
            durable_exhaustion=durable_exhaustion,
        )
        with self._writing():
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
        destination: str = DEFAULT_DESTINATION,
    ) -> list[Claimed]:
        durable = validate.flag("durable_exhaustion", durable_exhaustion)
        self.require("durable" if durable else "fenced", "claim_next_owned")
        table = self._delivery_table(destination)
        now, lease_until = check_lease(now, lease_until)
        if ordering not in ("chat", "none"):
            raise ValueError(f"ordering {ordering!r} is not 'chat' or 'none'")
        names = check_bots(bots)
        if names == []:
            return []
        shape = (destination, None if names is None else tuple(names))
        window, heads_first = self._chat_windows.get(shape, (chat_order.WINDOW, 0))
        numbers = {
            "now": now,
            "lease_until": lease_until,
            "max_attempts": validate.attempts("max_attempts", max_attempts),
            "limit": validate.positive("limit", limit),
            "window": window,
        }
        with self._writing():
            rows = await self._backend.claim_next_owned(
                table,
                numbers,
                ordering=ordering,
                bots=names,
                durable_exhaustion=durable_exhaustion,
                destination=None if table is self.table else destination,
            )
        if ordering == "chat" and rows:
            if len(self._chat_windows) >= 64:  # filters are few; callers listing new ones are not
                self._chat_windows.clear()
            walked_heads = bool(rows[0].walked_heads)
            self._chat_windows[shape] = chat_order.next_window(window, walked_heads, heads_first)
        claimed = [
            Claimed(
                identity=ClaimIdentity(
                    row.bot, row.update_id, row.attempts, row.claim_id, destination
                ),
                body=body,
                update_type=row.update_type,
                queue_key=row.queue_key,
                received_at=row.received_at,
                counted=row.counted,
                trace_context=getattr(row, "trace_context", None),  # None below 0007
                unreadable=unreadable,
            )
            for row in rows
            if row.state == "processing"
            for body, unreadable in (self._body_or_why(row),)
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
        identity = check_identity(identity)
        statement = claims.renew_owned(
            self._delivery_table(identity.destination),
            identity=identity,
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
        table = self._delivery_table(identity.destination)
        if connection is not None:
            # Inside the caller's transaction: hold the row until it commits.
            statement = claims.owns(table, identity=identity, at=at, lock=True)
            with translated_errors(self.table.name):
                row = (await connection.execute(statement)).first()
        else:
            # A bare answer: locking would release at once, and only wait behind other holders.
            async with self._read() as own:
                row = await self._backend.owns(own, table, identity, at)
        return None if row is None else int(row.due_at)

    async def owned_leases(self, identities: Sequence[ClaimIdentity], at: int) -> list[int | None]:
        self.require("fenced", "owns")
        checked = [check_identity(identity) for identity in identities]
        at = validate.millis("at", at)
        leases: dict[ClaimIdentity, int] = {}
        for destination, group in by_destination(checked, lambda identity: identity).items():
            table = self._delivery_table(destination)
            async with self._read() as connection:
                leases.update(await self._backend.owned_leases(connection, table, group, at))
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
        leases: dict[ClaimIdentity, int] = {}
        for destination, group in by_destination(latest.items(), lambda item: item[0]).items():
            table = self._delivery_table(destination)
            async with self._write() as connection:
                leases.update(await self._backend.renewed_leases(connection, table, group, now))
        for identity in latest.keys() - leases.keys():  # refused, or its row held: alone
            lease = await self.renewed_lease(identity, latest[identity], now)
            if lease is not None:
                leases[identity] = lease
        return [leases.get(identity) for identity, _ in renewals]
