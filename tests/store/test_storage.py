"""A full disk as the store sees it (`app/store/storage.py`, `app/store/errors.py`): each
database's words for it become StorageFull, and the writes that fail make one episode, told
once as it begins and once as it ends."""

from __future__ import annotations

import logging
import sqlite3

import psycopg
import pytest
from sqlalchemy import exc

from app.store import StorageFull, StoreBusy, StoreTimedOut, StoreUnavailable
from app.store.errors import translated_errors
from app.store.storage import QUIET_SECONDS, StorageWatch


def _driver_error(error: Exception) -> exc.DBAPIError:
    return exc.DBAPIError.instance("INSERT ...", [], error, type(error))


@pytest.mark.parametrize(
    ("driver", "kind", "words"),
    [
        (sqlite3.OperationalError("database or disk is full"), StorageFull, "disk is full"),
        (
            psycopg.errors.DiskFull(
                'could not extend file "base/5/16384": No space left on device'
            ),
            StorageFull,
            "could not extend file",
        ),
        (
            psycopg.errors.LockNotAvailable("canceling statement due to lock timeout"),
            StoreTimedOut,
            "lock",
        ),
        (sqlite3.OperationalError("database is locked"), StoreBusy, "locked"),
        (psycopg.OperationalError("connection refused"), StoreUnavailable, "refused"),
    ],
)
def test_each_database_s_words_for_its_failures_become_the_store_s(
    driver: Exception, kind: type[StoreUnavailable], words: str
) -> None:
    with pytest.raises(kind, match=words) as raised, translated_errors("updates"):
        raise _driver_error(driver)
    assert type(raised.value) is kind  # a lost connection is neither full nor a timeout


class Clocks:
    def __init__(self) -> None:
        self.seconds = 1_000.0

    def monotonic(self) -> float:
        return self.seconds

    def now(self) -> int:
        return round(self.seconds * 1000)


def test_an_episode_is_told_once_as_it_begins_and_once_as_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clocks = Clocks()
    watch = StorageWatch(monotonic=clocks.monotonic, now=clocks.now)
    full = StorageFull("database storage is full: database or disk is full")
    with caplog.at_level(logging.ERROR, logger="app.store.storage"):
        assert watch.failed(full)
        for _ in range(50):  # every request of the episode fails too
            clocks.seconds += 0.1
            assert not watch.failed(full)
        clocks.seconds += 1
        watch.wrote()  # the first write that lands: the episode ends with it, if it lasts
        assert watch.full
        clocks.seconds += QUIET_SECONDS
        watch.wrote()
    assert not watch.full
    [began, ended] = [record.getMessage() for record in caplog.records]
    assert "database or disk is full" in began
    assert "writes again after 6.0 s" in ended  # from the first failure to the first write
    [episode] = watch.untold
    assert (episode.began_at, episode.ended_at) == (1_000_000, 1_006_000)


def test_a_nearly_full_disk_that_fails_some_writes_is_one_episode(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clocks = Clocks()
    watch = StorageWatch(monotonic=clocks.monotonic, now=clocks.now)
    full = StorageFull("database storage is full: could not extend file")
    with caplog.at_level(logging.ERROR, logger="app.store.storage"):
        for _ in range(10):  # one write fails, the next lands, a second apart
            watch.failed(full)
            clocks.seconds += QUIET_SECONDS / 3
            watch.wrote()
            clocks.seconds += QUIET_SECONDS / 3
    assert watch.full
    assert len(caplog.records) == 1
    assert watch.episodes == 1
