"""Failed authentications, slowed per source address (docs/contract.md section 16): a wrong bearer
key (the request guard, `app.http.guard`) or a wrong key at the console's sign-in
(`app.console.pages`).

Each source has a bucket of `auth_failures_burst` failures that refills by one every
`auth_failure_seconds`. A failure takes one; a source whose bucket is empty is throttled: its
requests that need a key are answered 429 with `Retry-After` before the key is looked at (the
right key too: answering it would let a guesser go on guessing at full speed). Nothing ever
sleeps: a right key is answered at once and never counts, and a source that is not failing is
never slowed, whatever other sources do.

The source is the request's address as the webhook's allowlist reads it
(`app.http.sources.client_address`: `X-Forwarded-For` only from `trusted_proxies`, so a
client cannot claim another address). An IPv6 source counts as its /64, which one host or
one subscriber usually holds whole. A request whose address cannot be told (no peer address:
a server on a unix socket) is not throttled at all: all such requests would share one
allowance, and one stranger could spend it for everyone.

Memory stays bounded: the table holds at most `max_sources` sources, in the order they last
failed. Sources at its front whose buckets have refilled are forgotten as new failures come;
when a flood of new sources fills the table, the one that failed longest ago is forgotten
first (and may guess again).

Across processes and hosts nothing is shared: each process counts on its own, in memory,
and forgets on restart. N processes behind a balancer (or `serve` and each `worker` port)
allow N times the burst, and N times the rate, to one source.
"""

from __future__ import annotations

import ipaddress
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

from starlette.types import Scope

from app.config import Settings
from app.http.sources import Network, client_address

__all__ = ["MAX_SOURCES", "AuthThrottle"]

MAX_SOURCES = 10_000  # sources remembered at once: some hundred bytes each
UNKNOWN_SOURCE = "(unknown)"


class AuthThrottle:
    """The failed authentications of one process, by source address."""

    def __init__(
        self,
        *,
        burst: int,
        seconds: float,
        trusted_proxies: Sequence[Network] = (),
        max_sources: int = MAX_SOURCES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if burst < 1 or seconds <= 0 or max_sources < 1:
            raise ValueError("burst and max_sources must be at least 1, seconds over 0")
        self._interval = seconds
        # A source is throttled while its failures, each worth `seconds`, reach further
        # ahead than this: the burst, less the one failure that may still be made.
        self._allowance = (burst - 1) * seconds
        self._trusted_proxies = trusted_proxies
        self._max_sources = max_sources
        self._clock = clock
        # source -> when its bucket is full again (by `clock`), in the order they last failed.
        self._full_at: OrderedDict[str, float] = OrderedDict()

    @classmethod
    def of(cls, settings: Settings) -> AuthThrottle:
        return cls(
            burst=settings.auth_failures_burst,
            seconds=settings.auth_failure_seconds,
            trusted_proxies=settings.trusted_proxies,
        )

    def __len__(self) -> int:
        return len(self._full_at)

    def source(self, scope: Scope) -> str:
        """The source of an HTTP request, by its ASGI scope."""
        client = scope.get("client")
        peer = client[0] if client else None
        # Every X-Forwarded-For line: some proxies add a line rather than append to one.
        forwarded = b",".join(
            value for name, value in scope["headers"] if name == b"x-forwarded-for"
        )
        address = client_address(peer, forwarded.decode("latin-1"), self._trusted_proxies)
        if address is None:
            return UNKNOWN_SOURCE
        if isinstance(address, ipaddress.IPv6Address):
            return str(ipaddress.IPv6Network((address, 64), strict=False))
        return str(address)

    def retry_after(self, source: str) -> int:
        """Whole seconds `source` must wait before its next authentication (at least 1), or 0
        when it is not throttled (a source that cannot be told never is)."""
        if source == UNKNOWN_SOURCE:
            return 0
        full_at = self._full_at.get(source)
        if full_at is None:
            return 0
        wait = full_at - self._clock() - self._allowance
        return max(1, math.ceil(wait)) if wait > 0 else 0

    def failed(self, source: str) -> None:
        """Count a failed authentication of `source` (not of one that cannot be told: all
        such requests would share one allowance, and one stranger could spend it for all)."""
        if source == UNKNOWN_SOURCE:
            return
        now = self._clock()
        full_at = self._full_at.pop(source, None)
        self._forget(now)
        start = now if full_at is None else max(full_at, now)
        self._full_at[source] = start + self._interval

    def _forget(self, now: float) -> None:
        """Drop the sources whose buckets are full again, oldest failure first, and then as
        many more as it takes to leave room for one."""
        table = self._full_at
        while table and next(iter(table.values())) <= now:
            table.popitem(last=False)
        while len(table) >= self._max_sources:
            table.popitem(last=False)
