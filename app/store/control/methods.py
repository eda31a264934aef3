"""Operator control (revision 0004): pause and resume, the rate limiter's shared bucket, the
breaker each worker reports, and park. Every action writes its audit entry in the transaction
that acts, so an action and its record commit together."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Table

from app.store import history, outbox, validate
from app.store.checks import check_actor, check_identity, check_reason
from app.store.control import statements as control
from app.store.core import SqlCore
from app.store.operator_types import BotControl
from app.store.types import DEFAULT_DESTINATION, ClaimIdentity


class ControlMethods(SqlCore):
    def _controls(self, feature: str, destination: str) -> tuple[Table, str | None]:
        """Where the controls of `destination` are: the bot's row of `_bots` for `default`
        (a bot's pause holds every destination), its own row of `_destinations` (revision
        0010) for any other; with the key's destination (None in `_bots`)."""
        table, _, _ = self._operator_tables(feature)
        if destination == DEFAULT_DESTINATION:
            return table, None
        validate.destination_name(destination)
        beside = self._needing(self.destinations_table, f"destination {destination!r}", "0010")
        return beside, destination

    async def bot_controls(
        self, bots: Sequence[str] | None = None, *, destinations: bool = False
    ) -> list[BotControl]:
        """The controls of these bots (every bot with a row, when None), in bot order; a bot
        never paused nor limited has defaults. With `destinations`, those of their
        destinations beside `default` that have a row (revision 0010) instead."""
        table, _, _ = self._operator_tables("bot_controls")
        names = None if bots is None else [validate.bot_name(bot) for bot in bots]
        if destinations:
            if self.destinations_table is None:
                return []
            statement = control.bot_controls(self.destinations_table, names)
            async with self._read() as connection:
                return [_control(row) for row in (await connection.execute(statement)).all()]
        async with self._read() as connection:
            rows = (await connection.execute(control.bot_controls(table, names))).all()
        found = {row.bot: _control(row) for row in rows}
        if names is None:
            return list(found.values())
        return [found.get(name, BotControl(name)) for name in sorted(set(names))]

    async def pause(
        self,
        bot: str,
        *,
        at: int,
        by: str,
        reason: str | None = None,
        destination: str = DEFAULT_DESTINATION,
    ) -> bool:
        """Pause `bot` (every destination of it), or with `destination` beside `default` that
        destination alone: from this commit no claim of any process starts an attempt for it
        (attempts in flight finish); its updates are still recorded. True when this call
        paused it; a bot already paused keeps its first pause (and nothing is recorded)."""
        table, key = self._controls("pause", destination)
        bot, at, by = validate.bot_name(bot), validate.millis("at", at), check_actor(by)
        reason = check_reason(reason)
        statement = control.pause(
            table, self._backend.upsert, bot=bot, at=at, by=by, reason=reason, destination=key
        )
        target = _target(bot, key)
        async with self.transaction() as connection:
            row = (await connection.execute(statement)).one()
            paused = bool(row.paused_at == at and row.paused_by == by)
            if paused:
                detail = None if reason is None else {"reason": reason}
                await self._record(
                    connection,
                    at=at,
                    by=by,
                    action="pause",
                    target=target,
                    bots=[bot],
                    detail=detail,
                )
                data = {"bot": bot, **_named(key), "by": by, "reason": reason, "paused_at": at}
                await self._emit(connection, [outbox.Made("bot.paused", at, data)])
        return paused

    async def resume(
        self, bot: str, *, at: int, by: str, destination: str = DEFAULT_DESTINATION
    ) -> bool:
        """Resume a paused bot (or its paused `destination`) and wake the workers of every
        process; False (nothing recorded) when it was not paused."""
        table, key = self._controls("resume", destination)
        bot, at, by = validate.bot_name(bot), validate.millis("at", at), check_actor(by)
        statement = control.resume(table, bot=bot, destination=key)
        async with self.transaction() as connection:
            resumed = (await connection.execute(statement)).first()
            if resumed is not None:
                await self._record(
                    connection, at=at, by=by, action="resume", target=_target(bot, key), bots=[bot]
                )
                data = {"bot": bot, **_named(key), "by": by, "resumed_at": at}
                await self._emit(connection, [outbox.Made("bot.resumed", at, data)])
        if resumed is not None:
            await self.announce()
        return resumed is not None

    async def set_rate_limit(
        self,
        bot: str,
        per_second: float | None,
        *,
        at: int,
        by: str,
        destination: str = DEFAULT_DESTINATION,
    ) -> None:
        """At most `per_second` attempts start per second for `bot`'s `destination`, across
        every process (None lifts the limit). The limit's bucket starts empty."""
        table, key = self._controls("set_rate_limit", destination)
        bot, at, by = validate.bot_name(bot), validate.millis("at", at), check_actor(by)
        rate = validate.rate("per_second", per_second)
        statement = control.set_rate_limit(
            table, self._backend.upsert, bot=bot, per_second=rate, at=at, destination=key
        )
        async with self.transaction() as connection:
            await connection.execute(statement)
            await self._record(
                connection,
                at=at,
                by=by,
                action="rate_limit",
                target=_target(bot, key),
                bots=[bot],
                detail={"per_second": rate},
            )
        if rate is None:
            await self.announce()

    async def take_tokens(
        self, bot: str, wanted: int, *, now: int, destination: str = DEFAULT_DESTINATION
    ) -> int:
        """How many of `wanted` attempts of `bot`'s `destination` may start now under its
        rate limit, taken from the bucket every process shares (all of them when it has no
        limit). Give back what was not used with `return_tokens`."""
        table, key = self._controls("take_tokens", destination)
        bot, now = validate.bot_name(bot), validate.millis("now", now)
        wanted = validate.positive("wanted", wanted)
        async with self.transaction() as connection:
            row = (
                await connection.execute(control.bucket(table, bot=bot, destination=key))
            ).first()
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
            spend = control.spend_tokens(
                table, bot=bot, tokens=tokens - granted, at=refilled, destination=key
            )
            await connection.execute(spend)
        return granted

    async def return_tokens(
        self, bot: str, count: int, *, destination: str = DEFAULT_DESTINATION
    ) -> None:
        """Give back `count` tokens taken by `take_tokens` for attempts that did not start."""
        table, key = self._controls("return_tokens", destination)
        statement = control.return_tokens(
            table,
            bot=validate.bot_name(bot),
            count=validate.positive("count", count),
            destination=key,
        )
        async with self._write() as connection:
            await connection.execute(statement)

    async def report_breaker(
        self, bot: str, state: str, *, at: int, destination: str = DEFAULT_DESTINATION
    ) -> None:
        """Record the breaker transition a worker's breaker for `bot` just made. The shared
        row going from closed (or none) to open writes breaker.opened, and from open or
        half-open to closed breaker.closed: one event a change of the shared row, however
        many workers' breakers make it."""
        table, key = self._controls("report_breaker", destination)
        if state not in ("closed", "open", "half_open"):
            raise ValueError(f"breaker state {state!r} is not closed, open or half_open")
        bot, at = validate.bot_name(bot), validate.millis("at", at)
        upsert = self._backend.upsert
        statement = control.report_breaker(
            table, upsert, bot=bot, state=state, at=at, destination=key
        )
        if self._outbox() is None:
            async with self._write() as connection:
                await connection.execute(statement)
            return
        async with self.transaction() as connection:
            await connection.execute(control.ensure_bot(table, upsert, bot=bot, destination=key))
            held = control.breaker_of(table, bot=bot, destination=key)
            before = (await connection.execute(held)).scalar()
            await connection.execute(statement)
            kind = control.breaker_event(before, state)
            if kind is not None:
                data = {"bot": bot, **_named(key), "at": at}
                await self._emit(connection, [outbox.Made(kind, at, data)])

    async def replay(
        self,
        bot: str,
        destination: str,
        *,
        first: int,
        last: int,
        ordered: bool,
        at: int,
        by: str,
        dry_run: bool = False,
    ) -> int:
        """Deliver to `destination` the updates of `bot` from `first` to `last` (update ids,
        inclusive) that it never had (a destination added later; `default` for the rows
        `unrouted`), their bodies kept: each due at `at`, in its queue when `ordered`. How
        many; a dry run counts them and changes nothing. More than REPLAY_LIMIT is a
        ValueError, and nothing is replayed."""
        bot, at, by = validate.bot_name(bot), validate.millis("at", at), check_actor(by)
        destination = validate.destination_name(destination)
        first, last = validate.update_id(first), validate.update_id(last)
        if first > last:
            raise ValueError(f"the range {first}-{last} is empty: its first id is above its last")
        self._operator_tables("replay")
        deliveries = None
        if destination != DEFAULT_DESTINATION:
            deliveries = self._delivery_table(destination)
        else:
            self._needing(self.deliveries_table, "replay", "0010")
        rule = control.replayable(
            self.table, deliveries, bot=bot, destination=destination, first=first, last=last
        )
        statement = control.replay(
            self.table, deliveries, rule, destination=destination, ordered=ordered, at=at
        )
        async with self.transaction() as connection:
            matched = int((await connection.execute(control.count(self.table, rule))).scalar_one())
            if matched > REPLAY_LIMIT:
                raise ValueError(
                    f"{matched} updates to replay, over {REPLAY_LIMIT:,} at once: narrow the range"
                )
            if validate.flag("dry_run", dry_run) or not matched:
                return matched
            await connection.execute(statement)
            detail = {"destination": destination, "first": first, "last": last}
            await self._record(
                connection,
                at=at,
                by=by,
                action="replay",
                target=_target(bot, destination),
                bots=[bot],
                detail=detail,
                matched=matched,
                changed=matched,
            )
        await self.announce()
        return matched

    async def park(self, identity: ClaimIdentity, *, at: int, by: str, reason: str) -> bool:
        """End the attempt of exactly `identity` (leased, live or lapsed, or waiting for its
        retry) as an exhaustion with `reason`, which unblocks its chat; its late settle is
        refused as any lost claim's. False (nothing changed) for any other identity."""
        self._operator_tables("park")
        identity, at, by = check_identity(identity), validate.millis("at", at), check_actor(by)
        text = check_reason(reason)
        if not text:
            raise ValueError("reason is required to park an update")
        table = self._delivery_table(identity.destination)
        key = None if table is self.table else identity.destination
        statement = control.park(table, identity=identity, at=at, reason=text)
        follow = None
        kept = self._backend.history_of(table)
        if kept is not None:
            follow = history.ended(kept.attempts, identity, at=at, outcome="parked", error=text)
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
                    target=f"{_target(identity.bot, key)}/{identity.update_id}",
                    bots=[identity.bot],
                    detail={"attempt": identity.attempt, "reason": text},
                    matched=1,
                    changed=1,
                )
        if parked is not None:
            await self.announce()
        return parked is not None


REPLAY_LIMIT = 100_000  # updates one replay may deliver: a wider range is several replays


def _target(bot: str, destination: str | None) -> str:
    """An action's target in the audit log: the bot, or bot/destination."""
    return bot if destination is None else f"{bot}/{destination}"


def _named(destination: str | None) -> dict[str, str]:
    """An event's destination field, for a destination's controls (a bot's have none)."""
    return {} if destination is None else {"destination": destination}


def _control(row: Any) -> BotControl:
    return BotControl(
        bot=row.bot,
        destination=getattr(row, "destination", DEFAULT_DESTINATION),
        paused_at=row.paused_at,
        paused_by=row.paused_by,
        paused_reason=row.paused_reason,
        rate_per_second=row.rate_per_second,
        breaker=row.breaker,
        breaker_at=row.breaker_at,
        webhook_pending=getattr(row, "webhook_pending", None),
        webhook_error_date=getattr(row, "webhook_error_date", None),
        webhook_error_message=getattr(row, "webhook_error_message", None),
        webhook_checked_at=getattr(row, "webhook_checked_at", None),
    )
