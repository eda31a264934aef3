"""A fencing token for a downstream with a database of its own (needs SQLAlchemy 2).

`POST /v1/claims/owns` answers for the moment it was asked: a reclaim can pass between its
`owned: true` and the downstream's commit (check-then-act), so over HTTP it is a hint. The
fence is the guarantee, kept where the write happens: in the downstream's own transaction,
one conditional upsert records the newest attempt that has written each update (its
`FenceToken`: `received_at`, `attempt`, `claim_id`) and refuses a write from an older one.

    token = forwarded.fence_token  # None: a plain bot, or a service that sends no token
    async with engine.begin() as connection:
        if token is None or not await admit(connection, token):
            return 409  # a newer attempt of this update has written: write nothing
        await connection.execute(insert(orders).values(...))  # commits with the token

Once an attempt's transaction has committed through the fence, no attempt with an older
token commits through it for that update: not an earlier attempt of the same recording, and
not one of an earlier recording after the update was pruned and recorded again (its
attempts restart at 1; its `received_at` is later). The same token with another `claim_id`
is refused too. What the fence does not promise: that the writer still holds the lease when
it commits. An attempt whose newer rival has not written yet still writes (at least once
allows it; effects stay keyed by `(bot, update_id)`), but it can never write after the rival.

The check and the domain write commit together or not at all, on both backends:
- PostgreSQL: the upsert locks the update's fence row until the transaction ends. A
  concurrent writer of the same update waits, then is judged against what committed.
- SQLite: the upsert takes the database's write lock until the transaction ends.
Call `admit` first in the transaction (a SQLite transaction that read before it may fail to
take the write lock: an error, never a stale write), never on an `AUTOCOMMIT` connection
(the token would commit alone, and the check would prove nothing).

The table holds one row per update and the kit deletes none: a deleted row lets every older
attempt of that update write again. `create_fence` makes it; `fence_table(metadata)` puts it
into a downstream's own metadata (for its Alembic history) under a name of its choice.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    Integer,
    MetaData,
    Table,
    Text,
    and_,
    or_,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.dml import ReturningInsert

from telegram_intake_kit.forwarded import FenceToken

DEFAULT_FENCE_TABLE = "intake_fence"


def fence_table(metadata: MetaData, name: str = DEFAULT_FENCE_TABLE) -> Table:
    """The fence's table in `metadata`: per `(bot, update_id)`, the token of the newest
    attempt that has written."""
    return Table(
        name,
        metadata,
        Column("bot", Text, primary_key=True),
        Column("update_id", BigInteger, primary_key=True, autoincrement=False),
        Column("received_at", BigInteger, nullable=False),
        Column("attempt", Integer, nullable=False),
        Column("claim_id", Text, nullable=False),
    )


metadata = MetaData()
FENCE = fence_table(metadata)


async def create_fence(connection: AsyncConnection, table: Table = FENCE) -> None:
    """Create the fence's table unless it exists."""
    await connection.run_sync(lambda sync: table.create(sync, checkfirst=True))


def create_fence_sync(connection: Connection, table: Table = FENCE) -> None:
    """`create_fence` for a synchronous connection."""
    table.create(connection, checkfirst=True)


async def admit(connection: AsyncConnection, token: FenceToken, *, table: Table = FENCE) -> bool:
    """Record `token` as the newest writer of its update and say True, or say False (and
    change nothing) when a newer attempt, or another claim of the same attempt, has written.
    The answer holds until `connection`'s transaction ends; make the domain write in it."""
    result = await connection.execute(_admit(connection.dialect.name, token, table))
    return result.first() is not None


def admit_sync(connection: Connection, token: FenceToken, *, table: Table = FENCE) -> bool:
    """`admit` for a synchronous connection."""
    return connection.execute(_admit(connection.dialect.name, token, table)).first() is not None


def _admit(dialect: str, token: FenceToken, table: Table) -> ReturningInsert[Any]:
    identity = token.identity
    values = {
        "bot": identity.bot,
        "update_id": identity.update_id,
        "received_at": token.received_at,
        "attempt": identity.attempt,
        "claim_id": identity.claim_id,
    }
    if dialect == "postgresql":
        statement: postgresql.Insert | sqlite.Insert = postgresql.insert(table).values(values)
    elif dialect == "sqlite":
        statement = sqlite.insert(table).values(values)
    else:
        raise ValueError(f"the fence needs PostgreSQL or SQLite, not {dialect}")
    held, new = table.c, statement.excluded
    # The whole rule: a later recording, a later attempt of the same recording, or this very
    # attempt again (its second write). Otherwise nothing is updated and no row returned.
    later = or_(
        new.received_at > held.received_at,
        and_(
            new.received_at == held.received_at,
            or_(
                new.attempt > held.attempt,
                and_(new.attempt == held.attempt, new.claim_id == held.claim_id),
            ),
        ),
    )
    upsert = statement.on_conflict_do_update(
        index_elements=[held.bot, held.update_id],
        set_={"received_at": new.received_at, "attempt": new.attempt, "claim_id": new.claim_id},
        where=later,
    )
    return upsert.returning(held.attempt)
