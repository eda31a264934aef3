"""The workers' upkeep loop (`keep_table_forever`): statistics and vacuum checked every
round; a vacuum that failed (cancelled by the statement timeout on a bloated table) backs off
instead of starting again every second."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from app.dispatch import maintenance
from app.store import StoreUnavailable


class Upkeep:
    """A store's two upkeep methods, counted; its vacuum fails when told to."""

    def __init__(self, *, vacuum_fails: bool) -> None:
        self.vacuum_fails = vacuum_fails
        self.refreshes = self.reclaims = 0
        self.twenty_rounds = asyncio.Event()

    async def refresh_statistics(self, **_: Any) -> bool:
        self.refreshes += 1
        if self.refreshes == 20:
            self.twenty_rounds.set()
        return False

    async def reclaim_space(self, **_: Any) -> bool:
        self.reclaims += 1
        if self.vacuum_fails:
            raise StoreUnavailable("canceling statement due to statement timeout")
        return False


async def _rounds(store: Upkeep, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(maintenance, "UPKEEP_CHECK_SECONDS", 0.01)
    loop = asyncio.create_task(maintenance.keep_table_forever(store))  # type: ignore[arg-type]
    async with asyncio.timeout(30):
        await store.twenty_rounds.wait()
    loop.cancel()
    with pytest.raises(asyncio.CancelledError):
        await loop


async def test_a_vacuum_that_is_not_due_is_checked_every_round(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = Upkeep(vacuum_fails=False)
    await _rounds(store, monkeypatch)
    assert store.reclaims == store.refreshes


async def test_a_failed_vacuum_backs_off_while_the_statistics_go_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    store = Upkeep(vacuum_fails=True)
    await _rounds(store, monkeypatch)
    assert store.reclaims == 1  # the next try is RECLAIM_BACKOFF_SECONDS (60 s) away
    assert "statement_timeout_ms" in caplog.text
