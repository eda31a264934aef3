"""Operator control (revision 0004): pause and resume, the rate limiter's shared bucket, the
breaker each worker reports, and park. Every action writes its audit entry in the transaction
that acts, so an action and its record commit together."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from app.store import history, outbox, validate
from app.store.control import statements as control
from app.store.core import SqlCore, check_actor, check_identity, check_reason
from app.store.operator_types import BotControl
from app.store.types import ClaimIdentity


class ControlMethods(SqlCore):
    async def bot_controls(self, bots: Sequence[str] | None = None) -> list[BotControl]:
        """The controls of these bots (every bot with a row, when None), in bot order; a bot
        never paused nor limited has defaults."""
        table, _, _ = self._operator_tables("bot_controls")
        names = None if bots is None else [validate.bot_name(bot) for bot in bots]
        async with self._read() as connection:
            rows = (await connection.execute(control.bot_controls(table, names))).all()
        found = {row.bot: _control(row) for row in rows}
        if names is None:
            return list(found.values())
        return [found.get(name, BotControl(name)) for name in sorted(set(names))]

    async def pause(self, bot: str, *, at: int, by: str, reason: str | None = None) -> bool:
        """Pause `bot`: from this commit no claim of any process starts an attempt for it
        (attempts in flight finish); its updates are still recorded. True when this call
        paused it; a bot already paused keeps its first pause (and nothing is recorded)."""
        table, _, _ = self._operator_tables("pause")
        bot, at, by = validate.bot_name(bot), validate.millis("at", at), check_actor(by)
        reason = check_reason(reason)
        statement = control.pause(table, self._backend.upsert, bot=bot, at=at, by=by, reason=reason)
        async with self.transaction() as connection:
            row = (await connection.execute(statement)).one()
            paused = bool(row.paused_at == at and row.paused_by == by)
            if paused:
                detail = None if reason is None else {"reason": reason}
                await self._record(
                    connection, at=at, by=by, action="pause", target=bot, bots=[bot], detail=detail
                )
                data = {"bot": bot, "by": by, "reason": reason, "paused_at": at}
                await self._emit(connection, [outbox.Made("bot.paused", at, data)])
        return paused

    async def resume(self, bot: str, *, at: int, by: str) -> bool:
        """Resume a paused bot and wake the workers of every process; False (nothing
        recorded) when it was not paused."""
        table, _, _ = self._operator_tables("resume")
        bot, at, by = validate.bot_name(bot), validate.millis("at", at), check_actor(by)
        async with self.transaction() as connection:
            resumed = (await connection.execute(control.resume(table, bot=bot))).first()
            if resumed is not None:
                await self._record(
                    connection, at=at, by=by, action="resume", target=bot, bots=[bot]
                )
                data = {"bot": bot, "by": by, "resumed_at": at}
                await self._emit(connection, [outbox.Made("bot.resumed", at, data)])
        if resumed is not None:
            await self.announce()
        return resumed is not None

    async def set_rate_limit(self, bot: str, per_second: float | None, *, at: int, by: str) -> None:
        """At most `per_second` attempts start per second for `bot`, across every process
        (None lifts the limit). The limit's bucket starts empty."""
        table, _, _ = self._operator_tables("set_rate_limit")
        bot, at, by = validate.bot_name(bot), validate.millis("at", at), check_actor(by)
        rate = validate.rate("per_second", per_second)
        statement = control.set_rate_limit(
            table, self._backend.upsert, bot=bot, per_second=rate, at=at
        )
        async with self.transaction() as connection:
            await connection.execute(statement)
            await self._record(
                connection,
                at=at,
                by=by,
                action="rate_limit",
                target=bot,
                bots=[bot],
                detail={"per_second": rate},
            )
        if rate is None:
            await self.announce()

    async def take_tokens(self, bot: str, wanted: int, *, now: int) -> int:
        """How many of `wanted` attempts of `bot` may start now under its rate limit, taken
        from the bucket every process shares (all of them when it has no limit). Give back
        what was not used with `return_tokens`."""
        table, _, _ = self._operator_tables("take_tokens")
        bot, now = validate.bot_name(bot), validate.millis("now", now)
        wanted = validate.positive("wanted", wanted)
        async with self.transaction() as connection:
            row = (await connection.execute(control.bucket(table, bot=bot))).first()
            if row is None:
                return wanted
            rate = float(row.rate_per_second)
            # The bucket's clock never goes back: a caller whose `now` is behind the last
            # refill (read before it waited for this row's lock, or a process whose clock is a
            # little behind) refills nothing and leaves the refill time as it is. Moved back,
            # the next caller would be paid again for time already paid for.
            refilled = max(now, int(row.refilled_at))
            elapsed = refilled - int(row.refilled_at)
            tokens = min(max(rate, 1.0), float(row.tokens) + elapsed * rate / 1000)
            granted = min(wanted, int(tokens))
            spend = control.spend_tokens(table, bot=bot, tokens=tokens - granted, at=refilled)
            await connection.execute(spend)
        return granted

    async def return_tokens(self, bot: str, count: int) -> None:
        """Give back `count` tokens taken by `take_tokens` for attempts that did not start."""
        table, _, _ = self._operator_tables("return_tokens")
        statement = control.return_tokens(
            table, bot=validate.bot_name(bot), count=validate.positive("count", count)
        )
        async with self._write() as connection:
            await connection.execute(statement)

    async def report_breaker(self, bot: str, state: str, *, at: int) -> None:
        """Record the breaker transition a worker's breaker for `bot` just made. The shared
        row going from closed (or none) to open writes breaker.opened, and from open or
        half-open to closed breaker.closed: one event a change of the shared row, however
        many workers' breakers make it."""
        table, _, _ = self._operator_tables("report_breaker")
        if state not in ("closed", "open", "half_open"):
            raise ValueError(f"breaker state {state!r} is not closed, open or half_open")
        bot, at = validate.bot_name(bot), validate.millis("at", at)
        statement = control.report_breaker(table, self._backend.upsert, bot=bot, state=state, at=at)
        if self._outbox() is None:
            async with self._write() as connection:
                await connection.execute(statement)
            return
        async with self.transaction() as connection:
            await connection.execute(control.ensure_bot(table, self._backend.upsert, bot=bot))
            before = (await connection.execute(control.breaker_of(table, bot=bot))).scalar()
            await connection.execute(statement)
            kind = control.breaker_event(before, state)
            if kind is not None:
                await self._emit(connection, [outbox.Made(kind, at, {"bot": bot, "at": at})])

    async def park(self, identity: ClaimIdentity, *, at: int, by: str, reason: str) -> bool:
        """End the attempt of exactly `identity` (leased, live or lapsed, or waiting for its
        retry) as an exhaustion with `reason`, which unblocks its chat; its late settle is
        refused as any lost claim's. False (nothing changed) for any other identity."""
        _, _, attempts = self._operator_tables("park")
        identity, at, by = check_identity(identity), validate.millis("at", at), check_actor(by)
        text = check_reason(reason)
        if not text:
            raise ValueError("reason is required to park an update")
        statement = control.park(self.table, identity=identity, at=at, reason=text)
        follow = None
        if self.keeps_history:
            follow = history.ended(attempts, identity, at=at, outcome="parked", error=text)
        async with self.transaction() as connection:
            parked = await self._backend.transition(connection, statement, follow)
            if parked is not None:
                made = outbox.exhaustion(
                    parked, error=f"parked: {text}", at=at, reason="parked", by=by
                )
                await self._emit(connection, [made])
                await self._record(
                    connection,
                    at=at,
                    by=by,
                    action="park",
                    target=f"{identity.bot}/{identity.update_id}",
                    bots=[identity.bot],
                    detail={"attempt": identity.attempt, "reason": text},
                    matched=1,
                    changed=1,
                )
        if parked is not None:
            await self.announce()
        return parked is not None


def _control(row: Any) -> BotControl:
    return BotControl(
        bot=row.bot,
        paused_at=row.paused_at,
        paused_by=row.paused_by,
        paused_reason=row.paused_reason,
        rate_per_second=row.rate_per_second,
        breaker=row.breaker,
        breaker_at=row.breaker_at,
        webhook_pending=row.webhook_pending,
        webhook_error_date=row.webhook_error_date,
        webhook_error_message=row.webhook_error_message,
        webhook_checked_at=row.webhook_checked_at,
    )
