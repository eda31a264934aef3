"""Whether the database can write: a full disk as one episode, told once when it begins and
once when it ends.

A full disk fails every write of a process, and each failure is retried (the intake's 503s,
the workers' claims and settles): one log line each would be thousands, and an operator
would still not see at a glance when it began or ended. The store tells its `StorageWatch`
of every write (`SqlCore._writing`): a `StorageFull` begins an episode, logged once at ERROR
in the database's own words; the first write that succeeds once no write has failed for
`QUIET_SECONDS` ends it, logged once at ERROR too (an operator filtering on errors sees both).
A disk that is nearly full fails some writes and not others (PostgreSQL extends one table's
file and not another's): the quiet period keeps that one episode rather than a line a second.

While an episode lasts, the store probes a write of its own every `PROBE_SECONDS`
(`SqlCore.probe_storage`), so that it ends once there is room even in a process that nothing
else makes write (a worker with nothing due, an instance its load balancer took out of
rotation because `/readyz` said why). Each episode's `storage.full` and `storage.recovered`
events are written by that probe as soon as they can be (`app.store.outbox`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from app.store.errors import StorageFull

log = logging.getLogger(__name__)

# No failed write for this long, then a write that succeeds ends an episode: longer than the
# gaps between a nearly full disk's failures (Telegram's own retries come seconds apart).
QUIET_SECONDS = 3.0
PROBE_SECONDS = 0.5  # how often a store in an episode tries a write of its own


@dataclass(slots=True)
class Episode:
    """One stretch of a full disk as this process saw it: when (epoch ms by the watch's clock,
    the database's as the process last measured it) and the database's words for it."""

    began_at: int
    cause: str
    ended_at: int | None = None
    full_told: bool = False  # its storage.full event is written
    recovered_told: bool = False  # and, once it ended, its storage.recovered


class StorageWatch:
    """One store's episodes of a full disk (see the module). `monotonic` (seconds) times the
    quiet period; `now` (epoch ms) dates the episodes: the host's clock until `use_clock` gives
    the database's (`DatabaseClock.now`, which reads no database: it may not answer). Tests
    pass fakes."""

    def __init__(
        self,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        now: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self._monotonic = monotonic
        self._now = now
        self.episode: Episode | None = None  # the open one
        self.untold: list[Episode] = []  # ended or open, whose events are still to write
        self._last_failure = 0.0
        self._writing_since: int | None = None  # the first write since the last failure: epoch ms
        self.episodes = 0  # begun so far

    def use_clock(self, now: Callable[[], int]) -> None:
        """Date episodes by `now` (epoch ms), as the process's other times are."""
        self._now = now

    @property
    def full(self) -> bool:
        return self.episode is not None

    def failed(self, error: StorageFull) -> bool:
        """A write failed for want of space; whether this began an episode."""
        self._last_failure = self._monotonic()
        self._writing_since = None
        if self.episode is not None:
            return False
        self.episode = Episode(self._now(), str(error))
        self.untold.append(self.episode)
        self.episodes += 1
        log.error("%s: writes fail until space is freed (an episode of a full disk)", error)
        return True

    def wrote(self) -> None:
        """A write succeeded: the episode ends, once no write has failed for a while, as of
        the first write that succeeded since the last failure."""
        episode = self.episode
        if episode is None:
            return
        if self._writing_since is None:
            self._writing_since = self._now()
        if self._monotonic() - self._last_failure < QUIET_SECONDS:
            return
        episode.ended_at = self._writing_since
        self.episode = None
        log.error(
            "database storage writes again after %.1f s full (%s)",
            (episode.ended_at - episode.began_at) / 1000,
            episode.cause,
        )

    def told(self, episode: Episode) -> None:
        """Both of `episode`'s events are written (or the store writes none)."""
        if episode in self.untold and episode.recovered_told:
            self.untold.remove(episode)


def failure_level(error: BaseException | None) -> int:
    """The level of a line about one request or one turn of a loop that a store error failed:
    DEBUG for a full disk and whatever fails while its episode lasts, which the watch tells at
    ERROR once; WARNING otherwise."""
    quiet = isinstance(error, StorageFull) or getattr(error, "during_full_disk", False)
    return logging.DEBUG if quiet else logging.WARNING
