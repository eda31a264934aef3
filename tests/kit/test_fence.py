"""The fencing token (the kit's `fence`): a downstream with a database of its own refuses, in
its own transaction, a write from an attempt older than one that has written, across
reclaims and across a prune and re-record. `POST /v1/claims/owns` alone cannot: it is
check-then-act, and the control below shows a stale write landing through it.

The service is the real app on each backend (tests/api/conftest.py); each attempt's request
is made by the real forwarder and read by the kit, so the token is what a downstream gets.
The downstream's own database is a fresh one of the same backend, reached by plain
`create_async_engine` / `create_engine` with their defaults.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from types import SimpleNamespace

import httpx
import pytest
from pydantic import SecretStr
from sqlalchemy import (
    Column,
    Integer,
    MetaData,
    Table,
    Text,
    create_engine,
    insert,
    select,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine

from app.bot_settings import BotSettings
from app.dispatch.forward import Downstream
from app.store import ClaimIdentity, Completed
from telegram_intake_kit import FenceToken, Forwarded, Identity, IntakeClient, read_forwarded
from telegram_intake_kit.fence import (
    FENCE,
    admit,
    admit_sync,
    create_fence,
    create_fence_sync,
    fence_table,
)
from tests.api.conftest import KEY, Api, now_ms, serving
from tests.conftest import Storage
from tests.downstream import (
    SIGNING_SECRET,
    FakeDownstream,
    bot,
    dispatching,
    eventually,
    message,
    settings_for,
)

HOLD = 0.4  # how long a rival is seen waiting
# The downstream's domain table: one row per committed write, in commit order.
EFFECTS = Table(
    "effects",
    MetaData(),
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("bot", Text, nullable=False),
    Column("update_id", Integer, nullable=False),
    Column("attempt", Integer, nullable=False),
)
SHOP = BotSettings(
    name="shop",
    secret_token=SecretStr("shop-secret"),
    downstream_url="http://bot.internal/hook",  # type: ignore[arg-type]
    signing_secret=SecretStr(SIGNING_SECRET),
)


def own_url(url: str, *, sync: bool) -> str:
    """A storage URL for the downstream's own engine: pysqlite or aiosqlite, psycopg."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        driver = "sqlite+pysqlite" if sync else "sqlite+aiosqlite"
    else:
        driver = "postgresql+psycopg"
    return parsed.set(drivername=driver).render_as_string(hide_password=False)


Admission = Callable[[AsyncConnection, FenceToken], Awaitable[bool]]


async def admit_by_reading(connection: AsyncConnection, token: FenceToken) -> bool:
    """A broken fence, for a control: read the recorded token, compare, then write it
    unconditionally. Between the read and the write a newer attempt can commit."""
    held = (
        await connection.execute(
            select(FENCE.c.received_at, FENCE.c.attempt).where(
                FENCE.c.bot == token.identity.bot, FENCE.c.update_id == token.identity.update_id
            )
        )
    ).first()
    if held is not None and (held.received_at, held.attempt) >= (
        token.received_at,
        token.identity.attempt,
    ):
        return False
    await asyncio.sleep(HOLD)  # the gap the conditional upsert does not have
    values = {
        "bot": token.identity.bot,
        "update_id": token.identity.update_id,
        "received_at": token.received_at,
        "attempt": token.identity.attempt,
        "claim_id": token.identity.claim_id,
    }
    dialect = postgresql if connection.dialect.name == "postgresql" else sqlite
    statement = dialect.insert(FENCE).values(values)
    await connection.execute(
        statement.on_conflict_do_update(
            index_elements=[FENCE.c.bot, FENCE.c.update_id],
            set_={
                name: value
                for name, value in values.items()
                if name in ("received_at", "attempt", "claim_id")
            },
        )
    )
    return True


class OwnDatabase:
    """The downstream's own database: its effects table beside the kit's fence."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = create_async_engine(own_url(url, sync=False))

    async def create(self) -> None:
        async with self.engine.begin() as connection:
            await create_fence(connection)
            await connection.run_sync(EFFECTS.metadata.create_all)

    async def write(self, forwarded: Forwarded, how: str) -> bool:
        """The domain write of one attempt, in one transaction: through the fence (async or
        sync), or, as today's docs said was enough, after `owns` alone ("owns alone")."""
        token = forwarded.fence_token
        assert token is not None
        if how == "fence_sync":
            return await asyncio.to_thread(self._write_sync, token)
        async with self.engine.begin() as connection:
            if how == "fence" and not await admit(connection, token):
                return False
            await connection.execute(insert(EFFECTS).values(_effect(token)))
            return True

    def _write_sync(self, token: FenceToken) -> bool:
        engine = create_engine(own_url(self.url, sync=True))
        try:
            with engine.begin() as connection:
                if not admit_sync(connection, token):
                    return False
                connection.execute(insert(EFFECTS).values(_effect(token)))
                return True
        finally:
            engine.dispose()

    async def admits(self, token: FenceToken, admission: Admission = admit) -> bool:
        """One transaction that only passes the fence (and commits what it recorded)."""
        async with self.engine.begin() as connection:
            return await admission(connection, token)

    async def effects(self) -> list[int]:
        """The attempts that wrote, in commit order."""
        async with self.engine.connect() as connection:
            return list(await connection.scalars(select(EFFECTS.c.attempt).order_by(EFFECTS.c.seq)))


def _effect(token: FenceToken) -> dict[str, object]:
    identity = token.identity
    return {"bot": identity.bot, "update_id": identity.update_id, "attempt": identity.attempt}


@pytest.fixture
async def api(storage: Storage) -> AsyncIterator[Api]:
    async with serving(storage.url()) as served:
        yield served


@pytest.fixture
async def own(storage: Storage) -> AsyncIterator[OwnDatabase]:
    database = OwnDatabase(storage.url(revision=None))
    await database.create()
    yield database
    await database.engine.dispose()


def kit(identity: ClaimIdentity) -> Identity:
    return Identity(**dataclasses.asdict(identity))


async def forwarded(identity: ClaimIdentity, received_at: int) -> Forwarded:
    """The attempt's request as the service's forwarder sends it, read by the kit."""
    sent: list[httpx.Request] = []

    def capture(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200)

    await Downstream(SHOP, httpx.MockTransport(capture)).forward(
        identity, message(identity.update_id), lease_until=0, received_at=received_at
    )
    (request,) = sent
    return read_forwarded(request.headers, request.content, signing_secret=SIGNING_SECRET)


async def reclaim(api: Api, update_id: int = 1) -> ClaimIdentity:
    """The next attempt, claimed once the live one's lease has lapsed (the store takes the
    time from its caller)."""
    lease_until = (await api.row("shop", update_id)).due_at
    identity = await api.store.claim_owned(
        "shop",
        update_id,
        now=lease_until + 1,
        lease_until=lease_until + 60_001,
        max_attempts=8,
        durable_exhaustion=True,
    )
    assert identity is not None
    return identity


@pytest.mark.parametrize(
    "how",
    ["fence", "fence_sync", "owns alone"],
    ids=["admit", "admit_sync", "control: owns over HTTP alone"],
)
async def test_a_stale_attempt_that_owned_before_the_reclaim_cannot_write_after_the_newer_one(
    api: Api, own: OwnDatabase, how: str
) -> None:
    received_at = now_ms()
    first = await api.claim(received_at=received_at)
    first_request = await forwarded(first, received_at)
    async with IntakeClient(api.base, KEY) as intake:
        assert (await intake.owns(kit(first))).owned  # attempt 1 checks: it owns the update
        # ... and before it writes, its lease lapses and attempt 2 is claimed and writes.
        second = await reclaim(api)
        assert second.attempt == 2
        assert (await intake.owns(kit(second))).owned
        assert await own.write(await forwarded(second, received_at), how)
        assert not (await intake.owns(kit(first))).owned  # too late for attempt 1 to ask
    # Attempt 1 now acts on the owned: true it was given.
    wrote = await own.write(first_request, how)
    if how == "owns alone":
        # Check-then-act: the stale attempt's write lands after the newer attempt's.
        assert wrote
        assert await own.effects() == [2, 1]
    else:
        assert not wrote
        assert await own.effects() == [2]


async def test_a_re_recorded_update_is_admitted_over_every_attempt_of_the_pruned_one(
    api: Api, own: OwnDatabase
) -> None:
    # The first recording: attempts 1 to 3, each claimed after the last one's lease lapsed;
    # attempt 3 writes and completes, and the row is pruned.
    start = now_ms() - 600_000
    old_received_at = start - 1_000
    old = [await api.claim(received_at=old_received_at, now=start, lease_ms=1_000)]
    old += [await reclaim(api), await reclaim(api)]
    assert [identity.attempt for identity in old] == [1, 2, 3]
    assert await own.write(await forwarded(old[2], old_received_at), "fence")
    settled_at = (await api.row()).due_at
    assert await api.store.settle_owned(old[2], Completed(at=settled_at))
    assert await api.store.prune(settled_at + 1) == 1
    # Telegram sends the update again: recorded anew, its attempts restart at 1.
    new_received_at = now_ms()
    new = await api.claim(received_at=new_received_at)
    assert new.attempt == 1 < old[2].attempt  # the attempt alone would order it first
    new_request = await forwarded(new, new_received_at)
    assert await own.write(new_request, "fence")
    assert await own.write(new_request, "fence")  # the same attempt may write again
    for stale in old:  # a late handler of the first recording, whatever its attempt
        assert not await own.write(await forwarded(stale, old_received_at), "fence"), stale
    assert await own.effects() == [3, 1, 1]


@pytest.mark.parametrize("flavour", ["async", "sync"])
async def test_admit_orders_by_received_at_then_attempt_and_matches_the_claim_id(
    own: OwnDatabase, flavour: str
) -> None:
    def token(received_at: int, attempt: int, claim_id: str = "c") -> FenceToken:
        identity = Identity(
            bot="shop", update_id=1, attempt=attempt, claim_id=f"{claim_id}-{attempt}"
        )
        return FenceToken(identity, received_at)

    async def admits(candidate: FenceToken) -> bool:
        if flavour == "async":
            return await own.admits(candidate)

        def passes() -> bool:
            engine = create_engine(own_url(own.url, sync=True))
            try:
                with engine.begin() as connection:
                    return admit_sync(connection, candidate)
            finally:
                engine.dispose()

        return await asyncio.to_thread(passes)

    steps = [
        (token(100, 2), True, "the first write of an update"),
        (token(100, 2), True, "the same attempt again"),
        (token(100, 2, "other"), False, "the same attempt number, another claim"),
        (token(100, 1), False, "an earlier attempt"),
        (token(99, 7), False, "an earlier recording, whatever its attempt"),
        (token(100, 3), True, "a later attempt"),
        (token(100, 2), False, "the attempt that wrote before it"),
        (token(101, 1), True, "a later recording, attempts restarted"),
        (token(100, 3), False, "the earlier recording's newest attempt"),
    ]
    for candidate, expected, case in steps:
        assert await admits(candidate) is expected, case
    others = [
        FenceToken(Identity(bot="shop", update_id=2, attempt=1, claim_id="c"), 1),
        FenceToken(Identity(bot="cafe", update_id=1, attempt=1, claim_id="c"), 1),
    ]
    for other in others:
        assert await admits(other), "another update has a fence of its own"
    async with own.engine.connect() as connection:
        rows = (
            await connection.execute(select(FENCE).order_by(FENCE.c.bot, FENCE.c.update_id))
        ).all()
    assert [tuple(row) for row in rows] == [
        ("cafe", 1, 1, 1, "c"),
        ("shop", 1, 101, 1, "c-1"),
        ("shop", 2, 1, 1, "c"),
    ]


async def test_a_token_admitted_in_a_transaction_that_rolls_back_is_not_recorded(
    own: OwnDatabase,
) -> None:
    newer = FenceToken(Identity(bot="shop", update_id=1, attempt=2, claim_id="c-2"), 100)
    older = FenceToken(Identity(bot="shop", update_id=1, attempt=1, claim_id="c-1"), 100)
    async with own.engine.connect() as connection:
        transaction = await connection.begin()
        assert await admit(connection, newer)
        await transaction.rollback()  # its domain write failed
    assert await own.admits(older)  # attempt 2 wrote nothing, so attempt 1 still may


@pytest.mark.parametrize(
    "admission", [admit, admit_by_reading], ids=["admit", "control: read, then write"]
)
async def test_admit_holds_an_older_attempt_until_the_newer_one_commits(
    own: OwnDatabase, admission: Admission
) -> None:
    newer = FenceToken(Identity(bot="shop", update_id=1, attempt=2, claim_id="c-2"), 100)
    older = FenceToken(Identity(bot="shop", update_id=1, attempt=1, claim_id="c-1"), 100)
    async with own.engine.begin() as connection:
        assert await admission(connection, newer)
        # PostgreSQL: the older attempt waits for the fence row; SQLite: for the write lock.
        rival = asyncio.create_task(own.admits(older, admission))
        await asyncio.sleep(HOLD)
        if admission is admit:
            assert not rival.done(), "the older attempt passed while the newer one wrote"
    if admission is admit:
        assert await rival is False
    else:
        # A read locks nothing: the older attempt read the fence before the newer commit,
        # then wrote over it. This is why the fence is one conditional statement.
        assert await rival is True


async def test_the_fence_table_goes_into_a_downstreams_own_metadata(storage: Storage) -> None:
    metadata = MetaData()
    table = fence_table(metadata, "shop_fence")
    engine = create_engine(own_url(storage.url(revision=None), sync=True))
    try:
        metadata.create_all(engine)
        with engine.begin() as connection:
            create_fence_sync(connection, table)  # already there: nothing to do
            token = FenceToken(Identity(bot="shop", update_id=1, attempt=1, claim_id="c"), 1)
            assert admit_sync(connection, token, table=table)
            assert not admit_sync(
                connection, dataclasses.replace(token, received_at=0), table=table
            )
            assert connection.execute(select(table.c.attempt)).scalars().all() == [1]
    finally:
        engine.dispose()


def test_admit_needs_postgresql_or_sqlite() -> None:
    other = SimpleNamespace(dialect=SimpleNamespace(name="mysql"), execute=None)
    token = FenceToken(Identity(bot="shop", update_id=1, attempt=1, claim_id="c"), 1)
    with pytest.raises(ValueError, match="PostgreSQL or SQLite, not mysql"):
        admit_sync(other, token)  # type: ignore[arg-type]


async def test_the_workers_forward_the_recording_time_the_fence_orders_by(
    sqlite_storage: Storage, downstream: FakeDownstream
) -> None:
    settings = settings_for(sqlite_storage.url(), bot(downstream))
    async with dispatching(settings) as (_dispatcher, store):
        received_at = now_ms()
        assert await store.add("shop", 5, message(5), received_at, queue_key="42")
        received = await eventually(lambda: downstream.received)
    (request,) = received
    read = read_forwarded(request.headers, request.body, signing_secret=SIGNING_SECRET)
    assert read.fence_token is not None
    assert read.fence_token.received_at == received_at
    assert read.fence_token.identity.attempt == 1
