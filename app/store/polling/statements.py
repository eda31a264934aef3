"""Every statement of long polling (docs/contract.md section 11, revision 0004's `_bots` columns):
the one poller of a bot across every process, under a lease in its row, and the offset that confirms
to Telegram what it recorded.

The offset advances in the transaction that records the batch, and only while the lease is
still the caller's: a poller whose lease lapsed (another took over) can neither record nor
move the offset, so two processes never confirm past each other.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Insert, Table, Update, and_, or_, update

from app.store.predicates import Upsert


def take(
    bots: Table, upsert: Upsert, *, bot: str, holder: str, now: int, lease_until: int
) -> Insert:
    """Take or renew the bot's poller lease: when nobody holds it, it lapsed, or `holder` has
    it. RETURNING the stored offset only to the caller that holds it now."""
    b = bots.c
    insert: Any = upsert(bots)
    free = or_(b.poller.is_(None), b.poller_until < now, b.poller == holder)
    statement: Insert = insert.values(
        bot=bot, poller=holder, poller_until=lease_until
    ).on_conflict_do_update(
        index_elements=[b.bot],
        set_={"poller": holder, "poller_until": lease_until},
        where=free,
    )
    return statement.returning(b.poll_offset)


def advance(bots: Table, *, bot: str, holder: str, now: int, offset: int) -> Update:
    """Move the offset, while `holder`'s lease holds (RETURNING the bot only then)."""
    b = bots.c
    held = and_(b.bot == bot, b.poller == holder, b.poller_until >= now)
    return update(bots).where(held).values(poll_offset=offset).returning(b.bot)


def release(bots: Table, *, bot: str, holder: str) -> Update:
    b = bots.c
    return (
        update(bots)
        .where(b.bot == bot, b.poller == holder)
        .values(poller=None, poller_until=None)
        .returning(b.bot)
    )
