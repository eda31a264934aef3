"""A model-based test of the durable store: hypothesis drives random sequences of transitions
against the real store (SQLite and PostgreSQL) and a small pure-Python model of docs/contract.md
sections 2 and 4, and compares every answer and every row after every step.

The rules: add (one update, or several of one chat); claim and claim_owned; claim_next_owned
(per-chat order or none, a bot filter, a limit, spent attempts); renew and renew_owned; owns;
settle and settle_owned (the base methods match the attempt number alone); exhaust;
acknowledge (by identity, or as listed by due_exhaustions); prune; and the clock.
A transition's time is drawn around the clock or exactly at the row's due_at, the lease's
last instant, where an off-by-one would hide.

Identities come from a bundle of those the store returned, so stale identities (an earlier
attempt, or an attempt at a key since pruned and recorded again) are reused after re-claims;
a few are forged (one field changed). A stale or forged identity must never write.

Hypothesis state machines and pytest's async fixtures mix badly, so the synchronous rules run
the async store on one event loop the test owns. Times are passed explicitly from a model
clock; nothing sleeps.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

from app.store import Abandoned, ClaimIdentity, Completed, Failed, SqlUpdateStore, open_store
from tests.conftest import Storage

T = TypeVar("T")

BOTS = ("alpha", "beta")
UPDATE_IDS = (1, 2, 3)
KEYS = [(bot, update_id) for bot in BOTS for update_id in UPDATE_IDS]
SPENT = "attempts spent"
START = 1_000

bots = st.sampled_from(BOTS)
update_ids = st.sampled_from(UPDATE_IDS)
EDGE = "edge"  # an `at` exactly at the target row's due_at: the lease's last instant
PAST = "past"  # one millisecond after it: the first instant the lease has lapsed
# A transition's `at`: around the clock, or (often enough to matter) either side of the edge.
offsets = st.one_of(st.integers(-3, 3), st.sampled_from((EDGE, PAST)))
queue_keys = st.sampled_from((None, "chat:1", "chat:2"))
forgeries = st.sampled_from((None,) * 6 + ("attempt", "claim_id", "update_id", "bot"))


@dataclasses.dataclass
class Row:
    """The model of one row: the columns the store rules touch."""

    received_at: int
    queue_key: str | None = None
    state: str = "pending"
    attempts: int = 0
    due_at: int = 0
    claim_id: str | None = None
    settled_at: int | None = None
    error: str | None = None
    exhausted_at: int | None = None
    acknowledged_at: int | None = None

    def __post_init__(self) -> None:
        self.due_at = self.received_at

    def holds(self, identity: ClaimIdentity) -> bool:
        return self.attempts == identity.attempt and self.claim_id == identity.claim_id

    def live(self, identity: ClaimIdentity, at: int) -> bool:
        """The exact live claim: live at exactly due_at."""
        return self.holds(identity) and self.state == "processing" and self.due_at >= at

    def open_exhaustion(self) -> bool:
        return self.exhausted_at is not None and self.acknowledged_at is None

    def claimable(self, now: int) -> bool:
        return (
            self.state == "pending"
            or (self.state == "processing" and self.due_at < now)
            or (self.state == "failed" and self.due_at <= now)
        )


def forge(identity: ClaimIdentity, field: str | None) -> ClaimIdentity:
    """The identity with one field changed (or as it is, for None)."""
    match field:
        case "attempt":
            attempt = identity.attempt + 1 if identity.attempt == 1 else identity.attempt - 1
            return dataclasses.replace(identity, attempt=attempt)
        case "claim_id":
            return dataclasses.replace(identity, claim_id=str(uuid.uuid4()))
        case "update_id":
            return dataclasses.replace(identity, update_id=identity.update_id % 3 + 1)
        case "bot":
            other = BOTS[1] if identity.bot == BOTS[0] else BOTS[0]
            return dataclasses.replace(identity, bot=other)
    return identity


class StoreMachine(RuleBasedStateMachine):
    """The real store against the model; subclassed per test with `loop` and `url` set."""

    loop: asyncio.AbstractEventLoop
    url: str

    identities = Bundle("identities")
    exhausted = Bundle("exhausted")  # identities that exhaust() ended: acknowledgements aim here
    keys = Bundle("keys")  # keys once recorded (maybe since pruned): claims aim at these

    def __init__(self) -> None:
        super().__init__()
        self.clock = START
        self.model: dict[tuple[str, int], Row] = {}
        self.store: SqlUpdateStore = self.run(open_store(self.url))
        assert self.store.capability == "durable"
        self.run(self._clear())

    def at(self, identity: ClaimIdentity, offset: int | str) -> int:
        """The time a transition is asked at: around the clock, or the row's due_at."""
        row = self.model.get((identity.bot, identity.update_id))
        if offset in (EDGE, PAST):
            edge = row.due_at if row is not None else self.clock
            return edge + (offset == PAST)
        assert isinstance(offset, int)
        return self.clock + offset

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coroutine)

    async def _clear(self) -> None:
        async with self.store.engine.begin() as connection:
            await connection.execute(self.store.table.delete())

    def teardown(self) -> None:
        self.run(self.store.close())

    # -- the clock ---------------------------------------------------------------------------

    @rule(step=st.integers(0, 6))
    def advance(self, step: int) -> None:
        self.clock += step

    # -- transitions ---------------------------------------------------------------------------

    @rule(target=keys, bot=bots, update_id=update_ids, back=st.integers(0, 5), queue=queue_keys)
    def add(self, bot: str, update_id: int, back: int, queue: str | None) -> Any:
        received_at = self.clock - back
        body = f'{{"n":{update_id}}}'
        added = self.run(self.store.add(bot, update_id, body, received_at, queue_key=queue))
        key = (bot, update_id)
        expected = key not in self.model
        assert added == expected
        if not expected:
            return multiple()
        self.model[key] = Row(received_at=received_at, queue_key=queue)
        return multiple(key)

    @rule(
        target=keys,
        bot=bots,
        update_ids=st.lists(update_ids, min_size=2, max_size=3, unique=True),
        queue=queue_keys,
    )
    def add_chat(self, bot: str, update_ids: list[int], queue: str | None) -> Any:
        """Several updates of one chat at once: the states where per-chat order matters."""
        added = [self.add(bot, update_id, 0, queue) for update_id in sorted(update_ids)]
        return multiple(*(key for result in added for key in result.values))

    @rule(
        target=identities,
        key=keys,
        lease=st.integers(1, 10),
        max_attempts=st.integers(1, 3),
        durable=st.booleans(),
        fenced=st.booleans(),
    )
    def claim_owned(
        self, key: tuple[str, int], lease: int, max_attempts: int, durable: bool, fenced: bool
    ) -> Any:
        """claim_owned, or (fenced=False) the base `claim`, which answers the attempt number
        alone; on a revision 0002 table it mints a fresh claim_id all the same."""
        bot, update_id = key
        now = self.clock
        options = {"now": now, "lease_until": now + lease, "max_attempts": max_attempts}
        if fenced:
            identity = self.run(
                self.store.claim_owned(bot, update_id, **options, durable_exhaustion=durable)
            )
        else:
            attempt = self.run(
                self.store.claim(bot, update_id, **options, durable_exhaustion=durable)
            )
            identity = None
            if attempt is not None:
                stored = self.run(self.store.get_update(bot, update_id))
                assert stored is not None
                assert stored.claim_id is not None
                identity = ClaimIdentity(bot, update_id, attempt, stored.claim_id)
        row = self.model.get((bot, update_id))
        if row is None or not row.claimable(now):
            assert identity is None
            return multiple()
        if row.attempts < max_attempts:
            assert identity is not None
            assert (identity.bot, identity.update_id) == (bot, update_id)
            assert identity.attempt == row.attempts + 1
            assert identity.claim_id != row.claim_id  # a fresh claim_id for every claim
            row.state, row.attempts, row.due_at = "processing", identity.attempt, now + lease
            row.claim_id, row.settled_at = identity.claim_id, None
            return multiple(identity)
        # Spent: ended, no identity returned; a durable end keeps the last attempt's identity.
        assert identity is None
        assert row.claim_id is not None  # only a claimed row can be spent (max_attempts >= 1)
        self._spent(row, now, durable)
        return multiple()

    @staticmethod
    def _spent(row: Row, now: int, durable: bool) -> None:
        row.state, row.due_at, row.error = "abandoned", now, SPENT
        if durable:
            row.settled_at, row.exhausted_at = None, now
        else:
            row.settled_at = now

    # Most useful with something to take; an empty take is checked by the rule all the same.
    @precondition(lambda self: any(row.claimable(self.clock) for row in self.model.values()))
    @rule(
        target=identities,
        lease=st.integers(1, 10),
        max_attempts=st.integers(1, 3),
        limit=st.integers(1, 4),
        ordering=st.sampled_from(("chat", "none")),
        bots=st.sampled_from((None, ("alpha",), ("beta",))),
        durable=st.booleans(),
    )
    def claim_next_owned(
        self,
        lease: int,
        max_attempts: int,
        limit: int,
        ordering: str,
        bots: tuple[str, ...] | None,
        durable: bool,
    ) -> Any:
        now = self.clock
        eligible = [key for key, row in self.model.items() if self._eligible(key, row, now)]
        if bots is not None:
            eligible = [key for key in eligible if key[0] in bots]
        if ordering == "chat":
            eligible = [key for key in eligible if self._first_of_its_chat(key)]
        claimed = self.run(
            self.store.claim_next_owned(
                now=now,
                lease_until=now + lease,
                max_attempts=max_attempts,
                limit=limit,
                ordering=ordering,  # type: ignore[arg-type]
                bots=bots,
                durable_exhaustion=durable,
            )
        )
        # Which rows it took: the oldest due first, ties in either order; a row whose attempts
        # are spent is ended (not returned) and counts against the limit.
        taken = [key for key in eligible if self._taken(key)]
        assert len(taken) == min(limit, len(eligible))
        if taken:
            newest = max(self.model[key].due_at for key in taken)
            assert all(self.model[k].due_at >= newest for k in eligible if k not in taken)
        returned = {(c.identity.bot, c.identity.update_id): c.identity for c in claimed}
        for key in taken:
            row = self.model[key]
            if row.attempts < max_attempts:
                identity = returned.pop(key)
                assert identity.attempt == row.attempts + 1
                assert identity.claim_id != row.claim_id
                row.state, row.attempts, row.due_at = "processing", identity.attempt, now + lease
                row.claim_id, row.settled_at = identity.claim_id, None
            else:
                self._spent(row, now, durable)
        assert returned == {}  # nothing returned that the rules did not allow
        return multiple(*(c.identity for c in claimed))

    @staticmethod
    def _eligible(key: tuple[str, int], row: Row, now: int) -> bool:
        return row.claimable(now)

    def _first_of_its_chat(self, key: tuple[str, int]) -> bool:
        row = self.model[key]
        if row.queue_key is None:
            return True
        return not any(
            other_key[0] == key[0]
            and other.queue_key == row.queue_key
            and other_key[1] < key[1]
            and other.state in ("pending", "processing", "failed")
            for other_key, other in self.model.items()
        )

    def _taken(self, key: tuple[str, int]) -> bool:
        """Whether the last claim_next_owned changed this row (read back from the store)."""
        stored = self.run(self.store.get_update(*key))
        row = self.model[key]
        assert stored is not None
        return (stored.attempts, stored.claim_id, stored.state) != (
            row.attempts,
            row.claim_id,
            row.state,
        )

    @rule(
        identity=identities,
        field=forgeries,
        extend=st.integers(-5, 10),
        with_now=st.booleans(),
        offset=offsets,
        fenced=st.booleans(),
    )
    def renew_owned(
        self,
        identity: ClaimIdentity,
        field: str | None,
        extend: int,
        with_now: bool,
        offset: int | str,
        fenced: bool,
    ) -> None:
        """renew_owned, or (fenced=False) the base `renew`: the attempt number alone."""
        identity = forge(identity, field)
        lease_until = self.clock + extend
        now = self.at(identity, offset) if with_now else None
        if fenced:
            renewed = self.run(self.store.renew_owned(identity, lease_until, now))
        else:
            bot, update_id, attempt = identity.bot, identity.update_id, identity.attempt
            renewed = self.run(self.store.renew(bot, update_id, attempt, lease_until, now))
        row = self.model.get((identity.bot, identity.update_id))
        expected = (
            row is not None
            and (row.holds(identity) if fenced else row.attempts == identity.attempt)
            and row.state == "processing"
            and (now is None or row.due_at >= now)
        )
        assert renewed == expected
        if expected:
            assert row is not None
            row.due_at = max(row.due_at, lease_until)  # never shortens

    @rule(identity=identities, field=forgeries, offset=offsets)
    def owns(self, identity: ClaimIdentity, field: str | None, offset: int | str) -> None:
        identity = forge(identity, field)
        at = self.at(identity, offset)
        owned = self.run(self.store.owns(identity, at))
        row = self.model.get((identity.bot, identity.update_id))
        assert owned == (row is not None and row.live(identity, at))

    @rule(
        identity=identities,
        field=forgeries,
        kind=st.sampled_from(("completed", "failed", "abandoned")),
        offset=offsets,
        retry=st.integers(0, 10),
        fenced=st.booleans(),
    )
    def settle_owned(
        self,
        identity: ClaimIdentity,
        field: str | None,
        kind: str,
        offset: int | str,
        retry: int,
        fenced: bool,
    ) -> None:
        """settle_owned, or (fenced=False) the base `settle`: the attempt number alone, and
        no answer (the rows, compared after every step, tell whether it took effect)."""
        identity = forge(identity, field)
        at = self.at(identity, offset)
        settlement = {
            "completed": Completed(at),
            "failed": Failed(at, at + retry, "boom"),
            "abandoned": Abandoned(at, "gave up"),
        }[kind]
        row = self.model.get((identity.bot, identity.update_id))
        if fenced:
            settled = self.run(self.store.settle_owned(identity, settlement))
            expected = row is not None and row.live(identity, at)
            assert settled == expected
        else:
            bot, update_id, attempt = identity.bot, identity.update_id, identity.attempt
            self.run(self.store.settle(bot, update_id, attempt, settlement))
            expected = (
                row is not None
                and row.attempts == attempt
                and row.state == "processing"
                and row.due_at >= at
            )
        if not expected:
            return
        assert row is not None
        match settlement:
            case Completed():
                row.state, row.settled_at, row.due_at, row.error = "completed", at, at, None
            case Failed(retry_at=retry_at, error=error):
                row.state, row.settled_at, row.due_at, row.error = "failed", None, retry_at, error
            case Abandoned(error=error):
                row.state, row.settled_at, row.due_at, row.error = "abandoned", at, at, error

    @rule(target=exhausted, identity=identities, field=forgeries, offset=offsets)
    def exhaust(self, identity: ClaimIdentity, field: str | None, offset: int | str) -> Any:
        identity = forge(identity, field)
        at = self.at(identity, offset)
        exhausted = self.run(self.store.exhaust(identity, at, "exhausted"))
        row = self.model.get((identity.bot, identity.update_id))
        expected = row is not None and row.live(identity, at)
        assert exhausted == expected
        if not expected:
            return multiple()
        assert row is not None
        row.state, row.exhausted_at, row.due_at = "abandoned", at, at
        row.settled_at, row.error = None, "exhausted"
        return multiple(identity)

    @rule(identity=st.one_of(exhausted, identities), field=forgeries, offset=offsets)
    def acknowledge_exhaustion(
        self, identity: ClaimIdentity, field: str | None, offset: int
    ) -> None:
        identity = forge(identity, field)
        at = self.at(identity, offset)
        acknowledged = self.run(self.store.acknowledge_exhaustion(identity, at))
        row = self.model.get((identity.bot, identity.update_id))
        expected = row is not None and row.holds(identity) and row.open_exhaustion()
        assert acknowledged == expected
        if expected:
            assert row is not None
            row.acknowledged_at, row.settled_at, row.due_at = at, at, at

    @precondition(lambda self: any(row.open_exhaustion() for row in self.model.values()))
    @rule(pick=st.integers(0, 5), field=forgeries, offset=offsets)
    def acknowledge_listed(self, pick: int, field: str | None, offset: int | str) -> None:
        """The recovery path: acknowledge an exhaustion that `due_exhaustions` lists."""
        listed = self.run(self.store.due_exhaustions(limit=100))
        assert listed  # the invariant compares the list with the model
        self.acknowledge_exhaustion(listed[pick % len(listed)].identity, field, offset)

    @rule(back=st.integers(-5, 5))
    def prune(self, back: int) -> None:
        before = self.clock - back
        pruned = self.run(self.store.prune(before))
        gone = [
            key
            for key, row in self.model.items()
            if row.state in ("completed", "abandoned")
            and row.settled_at is not None
            and row.settled_at < before
        ]
        assert pruned == len(gone)
        for key in gone:
            del self.model[key]

    # -- invariants ----------------------------------------------------------------------------

    @invariant()
    def rows_match_the_model(self) -> None:
        for bot, update_id in KEYS:
            stored = self.run(self.store.get_update(bot, update_id))
            row = self.model.get((bot, update_id))
            if row is None:
                assert stored is None, (bot, update_id)
                continue
            assert stored is not None, (bot, update_id)
            actual = {name: getattr(stored, name) for name in dataclasses.asdict(row)}
            assert actual == dataclasses.asdict(row), (bot, update_id)

    @invariant()
    def open_exhaustions_match_the_model(self) -> None:
        listed = self.run(self.store.due_exhaustions(limit=100))
        expected = [
            (ClaimIdentity(bot, update_id, row.attempts, row.claim_id or "?"), row.exhausted_at)
            for (bot, update_id), row in sorted(self.model.items())
            if row.open_exhaustion()
        ]
        assert [(e.identity, e.exhausted_at) for e in listed] == expected


@pytest.mark.slow  # 60 examples of 40 steps a backend: about 25 s
@pytest.mark.xdist_group("store-model")  # untimed: not in the serial group
def test_store_matches_the_model(storage: Storage) -> None:
    loop = asyncio.new_event_loop()
    try:

        class Machine(StoreMachine):
            pass

        Machine.loop = loop
        # One migrated database per test; each example opens a fresh store and empties it.
        Machine.url = storage.url()
        run_state_machine_as_test(
            Machine,
            settings=settings(
                max_examples=60,
                stateful_step_count=40,
                deadline=None,
                derandomize=True,  # the same examples on every run: CI stays deterministic
                database=None,  # nothing saved between runs, nothing replayed
                # `storage` is function-scoped and deliberately shared by every example: each
                # example starts from an emptied table, so no state leaks between examples.
                suppress_health_check=[HealthCheck.function_scoped_fixture],
            ),
        )
    finally:
        loop.close()
