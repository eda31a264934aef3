"""Concurrent `owns` and `renew` callbacks share one statement each (app/api/leases.py),
answering each exactly."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

import pytest

from app.api.leases import LeaseChecks, LeaseRenewals
from app.store import ClaimIdentity, SqlUpdateStore, StoreUnavailable, open_store
from tests.conftest import Storage


class CountedStore(SqlUpdateStore):
    """The real store, counting the batched reads it is asked for."""

    reads: list[int]

    async def owned_leases(self, identities: Sequence[ClaimIdentity], at: int) -> list[int | None]:
        self.reads.append(len(identities))
        return await super().owned_leases(identities, at)


def _now() -> int:
    return time.time_ns() // 1_000_000


async def _held_and_forged(
    store: SqlUpdateStore, now: int, lease_ms: Callable[[int], int]
) -> tuple[list[ClaimIdentity], list[ClaimIdentity]]:
    """40 updates claimed at `now`, each leased `lease_ms(update_id)`; and every holder
    followed by a forgery of it (its claim_id changed)."""
    held: list[ClaimIdentity] = []
    for update_id in range(1, 41):
        await store.add("shop", update_id, "{}", now)
        identity = await store.claim_owned(
            "shop", update_id, now=now, lease_until=now + lease_ms(update_id), max_attempts=3
        )
        assert identity is not None
        held.append(identity)
    forged = [ClaimIdentity(i.bot, i.update_id, i.attempt, i.claim_id + "x") for i in held]
    return held, [identity for pair in zip(held, forged, strict=True) for identity in pair]


async def test_concurrent_checks_share_reads_and_each_gets_its_own_answer(
    storage: Storage,
) -> None:
    store = await open_store(storage.url())
    store.__class__ = CountedStore
    assert isinstance(store, CountedStore)
    store.reads = []
    checks = LeaseChecks(store, _now)
    await checks.start()
    try:
        now = _now()
        held, asked = await _held_and_forged(store, now, lambda update_id: 60_000 + update_id)
        answers = await asyncio.gather(*(checks.lease(identity) for identity in asked))
    finally:
        await checks.stop()
        await store.close()
    expected = [lease for i in held for lease in (now + 60_000 + i.update_id, None)]
    assert answers == expected
    assert sum(store.reads) == len(asked)
    assert len(store.reads) < len(asked) / 4, store.reads  # shared: 80 checks, a few reads


class CountedRenewals(SqlUpdateStore):
    reads: list[int]

    async def renewed_leases(
        self, renewals: Sequence[tuple[ClaimIdentity, int]], now: int
    ) -> list[int | None]:
        self.reads.append(len(renewals))
        return await super().renewed_leases(renewals, now)


async def test_concurrent_renewals_share_writes_extend_each_and_refuse_the_rest(
    storage: Storage,
) -> None:
    store = await open_store(storage.url())
    store.__class__ = CountedRenewals
    assert isinstance(store, CountedRenewals)
    store.reads = []
    renewals = LeaseRenewals(store, _now)
    await renewals.start()
    try:
        now = _now()
        # Leases that outlive the claim and the renewals on a slow, loaded machine.
        held, identities = await _held_and_forged(store, now, lambda _: 30_000)
        asked = [(identity, 600_000) for identity in identities]
        answers = await asyncio.gather(*(renewals.renew(i, ms) for i, ms in asked))
        leases = await store.owned_leases(held, now)
    finally:
        await renewals.stop()
        await store.close()
    assert [answer is not None for answer in answers] == [True, False] * 40
    renewed = [answer for answer in answers if answer is not None]
    assert all(lease >= now + 600_000 for lease in renewed)
    assert leases == renewed
    assert sum(store.reads) == len(asked)
    assert len(store.reads) < len(asked) / 4, store.reads


class UnavailableStore(SqlUpdateStore):
    async def owned_leases(self, identities: Sequence[ClaimIdentity], at: int) -> list[int | None]:
        raise StoreUnavailable("the database went away")


async def test_a_failed_read_answers_every_check_of_its_batch_and_a_stopped_one_is_unavailable(
    storage: Storage,
) -> None:
    store = await open_store(storage.url())
    store.__class__ = UnavailableStore
    checks = LeaseChecks(store, _now)
    await checks.start()
    identity = ClaimIdentity("shop", 1, 1, "00000000-0000-4000-8000-000000000000")
    try:
        answers = await asyncio.gather(
            *(checks.lease(identity) for _ in range(5)), return_exceptions=True
        )
        assert [str(answer) for answer in answers] == ["the database went away"] * 5
        assert all(isinstance(answer, StoreUnavailable) for answer in answers)
        await checks.stop()
        with pytest.raises(StoreUnavailable, match="shutting down"):
            await checks.lease(identity)
    finally:
        await checks.stop()
        await store.close()
