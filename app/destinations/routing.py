"""Where a bot's updates go: the destinations an update matches, decided as it is recorded,
and the update types Telegram must send for every destination's filter to be reachable."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from app.destinations.filters import expand
from app.destinations.settings import Destination
from app.queues import DEFAULT_UPDATES, OPT_IN, QUEUES
from app.store.types import TO_DEFAULT, Route


class Router:
    """Where one bot's updates go: the destinations whose filters an update passes, as the
    routes the intake records with it. A bot whose one destination is `default` taking every
    update (or that has none yet) routes every update to its row, with no filter run."""

    def __init__(self, targets: Sequence[Destination]) -> None:
        self._targets = tuple(targets)
        alone = not targets or (
            len(targets) == 1 and targets[0].default and targets[0].filter.everything
        )
        self._fixed: tuple[Route, ...] | None = TO_DEFAULT if alone else None

    def routes(self, update_type: str | None, update: Any) -> tuple[Route, ...]:
        """The routes of `update` (the whole update; `update_type` its kind), in the
        destinations' order: none when no filter passes it."""
        if self._fixed is not None:
            return self._fixed
        payload = update.get(update_type) if update_type is not None else None
        return tuple(
            Route(target.name, target.ordered)
            for target in self._targets
            if target.filter.matches(update_type, payload)
        )


def needed_updates(targets: Iterable[Destination]) -> tuple[str, ...] | None:
    """setWebhook's allowed_updates for these destinations: the update types their filters
    name, Telegram's default types where one takes every update, and the opt-in types
    (chat_member, message_reaction, message_reaction_count) wherever a filter names them; in
    the Bot API's order. None when every destination takes every update and none names an
    opt-in type (Telegram's default is what they need), or when there is no destination."""
    needed: set[str] = set()
    everything = False
    for target in targets:
        types = target.filter.update_types()
        if types is None:
            everything = True
        else:
            needed |= types
    if everything:
        if not needed & set(OPT_IN):
            return None
        needed |= set(DEFAULT_UPDATES)
    return tuple(name for name in QUEUES if name in needed) or None


def unreachable(targets: Iterable[Destination], allowed: Iterable[str]) -> list[str]:
    """Each filter query of a destination that none of `allowed` (setWebhook's
    allowed_updates) can ever match, in words naming the destination and the query."""
    given = set(allowed)
    found = []
    for target in targets:
        for query in target.filter.include:
            types = {path[0] for path in expand(query)}
            if not types & given:
                found.append(
                    f"destination {target.name!r}'s filter query {query!r} needs "
                    f"{' or '.join(sorted(types))}, which allowed_updates leaves out"
                )
    return found
