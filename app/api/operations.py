"""The operations API (docs/contract.md section 5): open exhaustions by cursor, one update's row,
and counts by bot and state. Read-only; acknowledging is in `app.api.claims`."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, TypeVar

from fastapi import APIRouter, HTTPException, Path, Query

from app.api.deps import REFUSALS, SeenFromQuery, StrictJsonRoute, Viewer
from app.store import BotStats, Exhaustion
from telegram_intake_kit.wire import (
    BOT_PATTERN,
    DEFAULT_DESTINATION,
    MAX_BIGINT,
    BotCounts,
    DestinationCounts,
    ExhaustionItem,
    ExhaustionPage,
    Identity,
    Problem,
    Stats,
    UpdateView,
)

Model = TypeVar("Model", bound=Identity)

router = APIRouter(
    route_class=StrictJsonRoute,
    prefix="/v1",
    tags=["operations"],
    responses={
        **REFUSALS,
        404: {"model": Problem, "description": "no such update"},
    },
)
CURSOR_PATTERN = BOT_PATTERN.removesuffix("$") + r":[0-9]{1,19}$"


@router.get("/exhaustions")
async def exhaustions(
    grant: Viewer,
    bot: Annotated[str | None, Query(pattern=BOT_PATTERN)] = None,
    after: Annotated[
        str | None,
        Query(pattern=CURSOR_PATTERN, description="`next` of the previous page: bot:update_id"),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1_000)] = 100,
    destination: SeenFromQuery = None,
) -> ExhaustionPage:
    """Unacknowledged exhaustions in `(bot, update_id)` order, a page at a time: those of
    deliveries to `destination` (default: the bots' own downstreams)."""
    destination = grant.seen_from(destination) or DEFAULT_DESTINATION
    cursor = None
    if after is not None:
        name, _, number = after.partition(":")
        if int(number) > MAX_BIGINT:
            raise HTTPException(422, f"after {after!r}: update_id over 2**63-1")
        cursor = (name, int(number))
    rows = await grant.services.store.due_exhaustions(
        limit=limit, after=cursor, bots=grant.bots(bot), destination=destination
    )
    items = [summary(row, ExhaustionItem, update=row.body) for row in rows]
    last = items[-1].key() if len(items) == limit else None
    return ExhaustionPage(items=items, next=last)


@router.get("/updates/{bot}/{update_id}")
async def get_update(
    grant: Viewer,
    bot: Annotated[str, Path(pattern=BOT_PATTERN)],
    update_id: Annotated[int, Path(ge=0, le=MAX_BIGINT)],
    destination: SeenFromQuery = None,
) -> UpdateView:
    """One update's row: state, attempts, times, last error, current claim, and its
    deliveries to the bot's other destinations. With `destination`, the update as that
    destination's service sees it: its delivery's fields, no other delivery listed."""
    seen_from = grant.seen_from(destination)
    grant.allow(bot)
    row = await grant.services.store.get_update(bot, update_id)
    if row is None:
        raise HTTPException(404, f"no update {update_id} of bot {bot!r} is recorded")
    if seen_from is not None and (row := row.seen_from(seen_from)) is None:
        raise HTTPException(404, f"update {update_id} of bot {bot!r} does not go to {seen_from!r}")
    return UpdateView.model_validate(row, from_attributes=True)


@router.get("/stats")
async def stats(grant: Viewer) -> Stats:
    """Rows by bot and state, the oldest undelivered row's age, open exhaustions; the same of
    the bots' other destinations' deliveries (`destinations`)."""
    services = grant.services
    now = services.now()
    rows = await services.store.stats()
    beside = await services.store.stats(deliveries=True)

    def counts(row: BotStats) -> dict[str, object]:
        oldest = row.oldest_undelivered_at
        return {
            "bot": row.bot,
            "states": dict(row.states),
            "oldest_undelivered_age_ms": None if oldest is None else now - oldest,
            "unacknowledged_exhaustions": row.unacknowledged_exhaustions,
        }

    return Stats(
        at=now,
        bots=[
            BotCounts.model_validate(counts(row))
            for row in rows
            if grant.key.allows(row.bot, DEFAULT_DESTINATION)
        ],
        destinations=[
            DestinationCounts.model_validate(counts(row) | {"destination": row.destination})
            for row in beside
            if grant.key.allows(row.bot, row.destination)
        ],
    )


def summary(exhaustion: Exhaustion, model: type[Model], **more: object) -> Model:
    """An exhaustion as the API shows it: its identity, error and time (and `more`)."""
    fields = {"error": exhaustion.error, "exhausted_at": exhaustion.exhausted_at, **more}
    return model.model_validate({**asdict(exhaustion.identity), **fields})
