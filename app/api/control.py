"""Operator control over HTTP (docs/contract.md section 9): the bots (pause, resume, rate limit),
search and attempt history, bulk redrive and acknowledgement, park, the audit log. The routes are
here, their messages in `app.api.control_messages`.

Reads need a `viewer` key, actions an `operator` key (a viewer's action is 403); every action
is recorded in the audit log under the key's name, in the transaction that acts. Bad input is
a 4xx naming the field and changes nothing: an unknown bot is 404, a bulk action with an
empty filter is 422 unless it says `all: true` (or is a dry run).
"""

from __future__ import annotations

import json
from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query

from app.api.control_messages import (
    AcknowledgedInBulk,
    AcknowledgeRequest,
    AttemptItem,
    AttemptList,
    AuditItem,
    AuditPage,
    BotAction,
    BotItem,
    BotList,
    BulkRequest,
    BulkSample,
    Filter,
    Parked,
    ParkRequest,
    PauseRequest,
    RateLimitRequest,
    RateLimitSet,
    Redriven,
    RedriveRequest,
    Replayed,
    ReplayRequest,
    State,
    UpdatePage,
)
from app.api.deps import REFUSALS, Grant, Operator, SeenFromQuery, StrictJsonRoute, Viewer
from app.api.operations import summary
from app.overview import bots_overview
from app.store import BulkOutcome, ClaimIdentity, ExhaustionFilter, UpdateFilter
from telegram_intake_kit.wire import (
    BOT_PATTERN,
    DEFAULT_DESTINATION,
    MAX_BIGINT,
    NO_NUL,
    Problem,
    UpdateView,
)

router = APIRouter(
    route_class=StrictJsonRoute,
    prefix="/v1",
    tags=["operator control"],
    responses={**REFUSALS, 404: {"model": Problem, "description": "no such bot or update"}},
)

SEARCH_CURSOR = r"^[0-9]{1,19}:[a-z0-9][a-z0-9_-]{0,31}:[0-9]{1,19}$"


# -- bots ----------------------------------------------------------------------------------------


@router.get("/bots")
async def bots(grant: Viewer) -> BotList:
    """Every configured bot this key may see: paused or running, its rate limit, counts by
    state, open exhaustions, the oldest undelivered update's age, the breaker."""
    grant.whole_bots()
    services = grant.services
    allowed = grant.bots(None)
    names = [bot.name for bot in services.settings.bots if allowed is None or bot.name in allowed]
    found = await bots_overview(services.store, services.settings, names, services.now())
    items = [BotItem.model_validate(bot, from_attributes=True) for bot in found]
    return BotList(items=items)


BotPath = Annotated[str, Path(pattern=BOT_PATTERN)]


# Whose controls: the bot's own (a pause holds every destination of it; a rate limit is
# destination `default`'s), or one other destination's.
DestinationQuery = Annotated[
    str,
    Query(pattern=BOT_PATTERN, description="one destination beside default; default: the bot"),
]


def _destination(grant: Grant, bot: str, destination: str, *, whole: bool = True) -> str:
    """`destination` of the configured `bot`; 404 for one it lacks, 403 for one the key may
    not act on. With `whole`, `default` stands for the bot as a whole (a pause holds all)."""
    configured = grant.bot(bot)
    if whole and destination == DEFAULT_DESTINATION:
        grant.whole_bots()
    grant.allow(bot, destination)
    if destination != DEFAULT_DESTINATION and configured.target(destination) is None:
        raise HTTPException(404, f"bot {bot!r} has no destination {destination!r}")
    return destination


@router.post("/bots/{bot}/pause")
async def pause(
    bot: BotPath,
    grant: Operator,
    request: PauseRequest | None = None,
    destination: DestinationQuery = DEFAULT_DESTINATION,
) -> BotAction:
    """Hold every new attempt of the bot (or of its `destination` alone), in every process
    (attempts in flight finish); its updates are still recorded and answered 200."""
    destination = _destination(grant, bot, destination)
    services = grant.services
    reason = None if request is None else request.reason
    changed = await services.store.pause(
        bot, at=services.now(), by=grant.key.label, reason=reason, destination=destination
    )
    return BotAction(bot=bot, changed=changed)


@router.post("/bots/{bot}/resume")
async def resume(
    bot: BotPath, grant: Operator, destination: DestinationQuery = DEFAULT_DESTINATION
) -> BotAction:
    """Lift the pause; the workers of every process look at once."""
    destination = _destination(grant, bot, destination)
    services = grant.services
    changed = await services.store.resume(
        bot, at=services.now(), by=grant.key.label, destination=destination
    )
    if changed:
        await services.wake()
    return BotAction(bot=bot, changed=changed)


@router.post("/bots/{bot}/rate-limit")
async def rate_limit(
    bot: BotPath,
    request: RateLimitRequest,
    grant: Operator,
    destination: DestinationQuery = DEFAULT_DESTINATION,
) -> RateLimitSet:
    """At most `per_second` attempts of the bot's `destination` start per second, across
    every process; a throttled update spends no attempt. null lifts the limit."""
    destination = _destination(grant, bot, destination, whole=False)
    services = grant.services
    await services.store.set_rate_limit(
        bot, request.per_second, at=services.now(), by=grant.key.label, destination=destination
    )
    if request.per_second is None:
        await services.wake()
    return RateLimitSet(bot=bot, rate_limit_per_second=request.per_second)


@router.post("/bots/{bot}/replay")
async def replay(bot: BotPath, request: ReplayRequest, grant: Operator) -> Replayed:
    """Deliver to `destination` the updates from `first_update_id` to `last_update_id` that
    it never had (one added later; for `default`, the updates that did not go there), whose
    bodies are kept: each due now, in update order within its queue. At most 100,000 at once
    (422 beyond, nothing replayed); a dry run counts them and changes nothing."""
    destination = _destination(grant, bot, request.destination, whole=False)
    target = grant.bot(bot).target(destination)
    ordered = target is None or target.ordered
    services = grant.services
    try:
        matched = await services.store.replay(
            bot,
            destination,
            first=request.first_update_id,
            last=request.last_update_id,
            ordered=ordered,
            at=services.now(),
            by=grant.key.label,
            dry_run=request.dry_run,
        )
    except ValueError as error:
        raise HTTPException(422, str(error)) from None
    replayed = 0 if request.dry_run else matched
    if replayed:
        await services.wake()
    return Replayed(bot=bot, destination=destination, matched=matched, replayed=replayed)


# -- updates ------------------------------------------------------------------------------------


@router.get("/updates")
async def search(
    grant: Viewer,
    bot: Annotated[str | None, Query(pattern=BOT_PATTERN)] = None,
    state: State | None = None,
    chat: Annotated[str | None, Query(min_length=1, max_length=500, pattern=NO_NUL)] = None,
    update_type: Annotated[str | None, Query(min_length=1, max_length=100, pattern=NO_NUL)] = None,
    received_after: Annotated[int | None, Query(ge=0, le=MAX_BIGINT)] = None,
    received_before: Annotated[int | None, Query(ge=0, le=MAX_BIGINT)] = None,
    contains: Annotated[str | None, Query(min_length=1, max_length=500, pattern=NO_NUL)] = None,
    user: Annotated[str | None, Query(pattern=r"^-?[0-9]{1,19}$")] = None,
    after: Annotated[
        str | None,
        Query(pattern=SEARCH_CURSOR, description="`next` of the previous page"),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    destination: SeenFromQuery = None,
) -> UpdatePage:
    """Recorded updates, newest first, by every filter given: `chat` is the queue key,
    `received_after` inclusive and `received_before` exclusive (epoch ms), `contains` a
    substring of the raw body, searched among at most 1,000 rows of the other filters per
    page (a page may then be short, or empty, with `next` set; encrypted bodies are opened
    by the service to search them), `user` a user's or a chat's id named anywhere in the
    update (sender, chat, member, contact, reply, forward...). With `destination`, the
    updates that go to it, each with its delivery's state, attempts, times and claim."""
    seen_from = grant.seen_from(destination)
    if bot is not None:
        grant.bot(bot)
    names = [bot] if bot is not None else _visible(grant)
    if not names:
        return UpdatePage(items=[], next=None)
    cursor = None
    if after is not None:
        received, name, number = after.split(":")
        if int(received) > MAX_BIGINT or int(number) > MAX_BIGINT:
            raise HTTPException(422, f"after {after!r}: a number over 2**63-1")
        cursor = (int(received), name, int(number))
    chosen = UpdateFilter(
        bots=tuple(names),
        state=state,
        chat=chat,
        update_type=update_type,
        received_after=received_after,
        received_before=received_before,
        contains=contains,
        user=user,
        destination=seen_from,
    )
    page = await grant.services.store.search_updates(chosen, after=cursor, limit=limit)
    items = [UpdateView.model_validate(row, from_attributes=True) for row in page.items]
    following = None if page.next is None else ":".join(str(part) for part in page.next)
    return UpdatePage(items=items, next=following)


@router.get("/updates/{bot}/{update_id}/attempts")
async def attempts(
    grant: Viewer,
    bot: BotPath,
    update_id: Annotated[int, Path(ge=0, le=MAX_BIGINT)],
    destination: SeenFromQuery = None,
) -> AttemptList:
    """Every attempt of the update's delivery (to `destination`, default the bot's own),
    oldest first: its claim, times, outcome, the downstream's HTTP status, an excerpt of its
    error, the worker that ran it."""
    destination = grant.seen_from(destination) or DEFAULT_DESTINATION
    grant.allow(bot)
    records = await grant.services.store.attempt_history(bot, update_id, destination=destination)
    if records is None:
        missing = f"no update {update_id} of bot {bot!r} is recorded"
        if destination != DEFAULT_DESTINATION:
            missing += f" with a delivery to {destination!r}"
        raise HTTPException(404, missing)
    items = [AttemptItem.model_validate(record, from_attributes=True) for record in records]
    return AttemptList(items=items)


@router.post("/updates/{bot}/{update_id}/park")
async def park(
    grant: Operator,
    bot: BotPath,
    update_id: Annotated[int, Path(ge=0, le=MAX_BIGINT)],
    request: ParkRequest,
) -> Parked:
    """End the live or waiting attempt of a poison update as an exhaustion with `reason`:
    its chat moves on, and the attempt's late answer is ignored."""
    grant.allow(bot, request.destination)
    if request.bot not in (None, bot) or request.update_id not in (None, update_id):
        raise HTTPException(422, "bot and update_id in the body differ from the path's")
    identity = ClaimIdentity(bot, update_id, request.attempt, request.claim_id, request.destination)
    services = grant.services
    parked = await services.store.park(
        identity, at=services.now(), by=grant.key.label, reason=request.reason
    )
    if parked:
        await services.wake()
    return Parked(parked=parked)


# -- exhaustions in bulk ------------------------------------------------------------------------


@router.post("/exhaustions/redrive")
async def redrive(request: RedriveRequest, grant: Operator) -> Redriven:
    """Deliver open exhaustions again, by filter or by exact identities: each becomes due with
    a fresh attempt budget (its attempt numbers go on, so no earlier identity matches again),
    paced at `rate_per_second`. A dry run reports the count and a sample and changes nothing."""
    named = [request.filter.bot] if request.filter and request.filter.bot else []
    for name in named + [identity.bot for identity in request.identities or ()]:
        grant.bot(name)  # 404 unless configured: no worker would deliver a redriven update
    selection = _selection(request, grant, configured=True)
    services = grant.services
    outcome = await services.store.redrive(
        selection,
        at=services.now(),
        by=grant.key.label,
        dry_run=request.dry_run,
        rate_per_second=request.rate_per_second,
    )
    if outcome.changed:
        await services.wake()
    return Redriven(matched=outcome.matched, redriven=outcome.changed, sample=_sample(outcome))


async def acknowledge_in_bulk(request: AcknowledgeRequest, grant: Grant) -> AcknowledgedInBulk:
    """`POST /v1/exhaustions/acknowledge` with a filter or identities (`app.api.claims`)."""
    if not grant.key.may("operator"):
        raise HTTPException(403, "this API key lacks the operator scope")
    selection = _selection(request, grant)
    services = grant.services
    outcome = await services.store.acknowledge_exhaustions(
        selection, at=services.now(), by=grant.key.label, dry_run=request.dry_run
    )
    return AcknowledgedInBulk(
        matched=outcome.matched, acknowledged=outcome.changed, sample=_sample(outcome)
    )


@router.get("/audit")
async def audit(
    grant: Viewer,
    after: Annotated[int | None, Query(ge=1, le=MAX_BIGINT)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> AuditPage:
    """Every operator action, newest first: the key's name, action, target, its filter or
    reason, the counts, the time. A key limited to some bots reads only the actions that
    concern none but them."""
    grant.whole_bots()
    entries = await grant.services.store.audit_log(after=after, limit=limit, bots=grant.bots(None))
    items = [
        AuditItem(
            id=entry.id,
            at=entry.at,
            key_name=entry.key_name,
            action=entry.action,
            target=entry.target,
            detail=None if entry.detail is None else json.loads(entry.detail),
            matched=entry.matched,
            changed=entry.changed,
        )
        for entry in entries
    ]
    return AuditPage(items=items, next=items[-1].id if len(items) == limit else None)


# -- helpers ------------------------------------------------------------------------------------


def _visible(grant: Grant) -> list[str]:
    allowed = grant.bots(None)
    names = [bot.name for bot in grant.services.settings.bots]
    return [name for name in names if allowed is None or name in allowed]


def _selection(
    request: BulkRequest, grant: Grant, *, configured: bool = False
) -> ExhaustionFilter | list[ClaimIdentity]:
    """What a bulk action takes, within the key's bots; with `configured`, only within the
    configured bots too (a redriven update of a bot no worker serves would never be
    delivered)."""
    if request.identities is not None:
        for identity in request.identities:
            grant.allow(identity.bot, identity.destination)
        return [
            ClaimIdentity(i.bot, i.update_id, i.attempt, i.claim_id, i.destination)
            for i in request.identities
        ]
    chosen = request.filter or Filter()
    if chosen.bot is not None:
        grant.allow(chosen.bot)  # a bot no longer configured may still have exhaustions
    # A key limited to destinations acts on one of its own: the one named, or its only one.
    asked = chosen.destination if "destination" in chosen.model_fields_set else None
    if (seen_from := grant.seen_from(asked)) is not None:
        chosen = chosen.model_copy(update={"destination": seen_from})
    bots = (chosen.bot,) if chosen.bot is not None else grant.bots(None)
    if bots is None and configured:
        bots = _visible(grant)
    return chosen.within(bots)


def _sample(outcome: BulkOutcome) -> list[BulkSample]:
    return [summary(exhaustion, BulkSample) for exhaustion in outcome.sample]
