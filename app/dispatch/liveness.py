"""Whether the dispatcher's loops still go round: what a worker's /healthz reports.

Each loop beats once a turn (the claim loop before each look, the lease keeper every tick). A
loop whose task raised or was cancelled while the dispatcher runs has died (the loops never
return while it runs; the listener returns at once on SQLite, which has no notifications, and
that is no death); one that has not beaten for
`stall_seconds` (by the local monotonic clock, injectable) has stalled. Either way the process
cannot deliver, and a restart is what helps: `/healthz` answers 503 and names the loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping


class Liveness:
    def __init__(
        self, *, stall_seconds: float, monotonic_ns: Callable[[], int] = time.monotonic_ns
    ) -> None:
        self._stall_ns = int(stall_seconds * 1_000_000_000)
        self._monotonic_ns = monotonic_ns
        self._beats: dict[str, int] = {}

    def beater(self, name: str) -> Callable[[], None]:
        """The beat of the loop `name`, which counts from now."""
        self._beats[name] = self._monotonic_ns()

        def beat() -> None:
            self._beats[name] = self._monotonic_ns()

        return beat

    def problems(self, tasks: Mapping[str, asyncio.Task[None] | None]) -> list[str]:
        """What is wrong: each task of `tasks` that has ended, each loop that has stalled."""
        found = [f"{name} died" for name, task in tasks.items() if task is None or _died(task)]
        now = self._monotonic_ns()
        for name, beaten in self._beats.items():
            if now - beaten > self._stall_ns:
                found.append(f"{name} stalled: no turn for {(now - beaten) / 1e9:.0f} s")
        return found


def _died(task: asyncio.Task[None]) -> bool:
    return task.done() and (task.cancelled() or task.exception() is not None)
