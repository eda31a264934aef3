"""The callback API (docs/contract.md section 5): a downstream asks whether it still owns its
attempt, extends its lease, and settles. Every answer is the store's fenced transition for the exact
identity, run at the database clock's now: a stale or recycled identity changes nothing."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Response

from app.api.control import acknowledge_in_bulk
from app.api.control_messages import AcknowledgedInBulk, AcknowledgeRequest
from app.api.deps import REFUSALS, Callback, CallbackOrOperator, Grant, StrictJsonRoute
from app.api.lean import LeanRoute
from app.destinations.settings import DeliveryOptions
from app.policy import Outcome, retry_delay_ms
from app.store import Abandoned, ClaimIdentity, Completed, Failed
from telegram_intake_kit.wire import (
    DEFAULT_DESTINATION,
    Acknowledged,
    Identity,
    Owned,
    Problem,
    Renewed,
    RenewRequest,
    Settled,
    SettleRequest,
)

RESPONSES: dict[int | str, dict[str, object]] = {
    **REFUSALS,
    404: {"model": Problem, "description": "the bot, or its destination, is not configured"},
    409: {"model": Problem, "description": "a plain bot, or a table below revision 0002"},
}
# `owns` and `renew`, asked on every update: lean routes (`app.api.lean`).
callbacks = APIRouter(route_class=LeanRoute, prefix="/v1", tags=["callback"], responses=RESPONSES)
router = APIRouter(
    route_class=StrictJsonRoute, prefix="/v1", tags=["callback"], responses=RESPONSES
)


def _fenced(grant: Grant, identity: Identity) -> tuple[DeliveryOptions, ClaimIdentity]:
    """The identity as the store compares it, and how its destination's deliveries go (the
    bot's own options for `default`); 404 for a destination the bot lacks."""
    bot = grant.bot(identity.bot)
    destination = identity.destination
    grant.allow(bot.name, destination)
    options: DeliveryOptions = bot  # default, the common case, is always there
    if destination != DEFAULT_DESTINATION:
        target = bot.target(destination)
        if target is None:
            raise HTTPException(404, f"bot {bot.name!r} has no destination {destination!r}")
        options = target.options
    if options.mode == "plain":
        raise HTTPException(
            409, f"bot {bot.name!r} is in plain mode: its attempts carry no identity"
        )
    claim = ClaimIdentity(
        identity.bot, identity.update_id, identity.attempt, identity.claim_id, destination
    )
    return options, claim


def _answer(flag: str, lease: int | None) -> Response:
    """`{flag: bool, "lease_expires_at": int|null}` written directly: the route's declared
    model documents it, and the answer skips the model's validation and serialisation, a good
    share of a callback's time on this hot path (`Owned`, `Renewed`)."""
    if lease is None:
        body = f'{{"{flag}":false,"lease_expires_at":null}}'
    else:
        body = f'{{"{flag}":true,"lease_expires_at":{int(lease)}}}'
    return Response(body, media_type="application/json")


@callbacks.post("/claims/owns", response_model=Owned)
async def owns(identity: Identity, grant: Callback) -> Response:
    """Whether this exact attempt holds a live lease now, and until when. Check it just before
    a domain write; where the downstream shares the database, check inside the write's own
    transaction instead (`telegram_intake_owns`, or `app.store.fencing`)."""
    _, claim = _fenced(grant, identity)
    lease = await grant.services.owned_lease(claim)  # concurrent checks share one read
    return _answer("owned", lease)


@callbacks.post("/claims/renew", response_model=Renewed)
async def renew(request: RenewRequest, grant: Callback) -> Response:
    """Extend a live lease to `lease_ms` from now (never shortened, never revived once
    lapsed). A 202-deferring downstream renews before `X-Intake-Lease-Expires-At`."""
    bot, claim = _fenced(grant, request)
    lease_ms = request.lease_ms or int(bot.lease_seconds * 1000)
    lease = await grant.services.renewed_lease(claim, lease_ms)  # concurrent renews share one
    return _answer("renewed", lease)


@router.post("/claims/settle")
async def settle(request: SettleRequest, grant: Callback) -> Settled:
    """End the attempt: `completed`; `failed` (retried after `retry_after_ms`, else the bot's
    backoff); `exhausted` (an exhaustion kept until acknowledged on a durable bot, abandoned
    on a fenced one). Only the exact live identity settles."""
    bot, claim = _fenced(grant, request)
    services = grant.services
    store = services.store
    now = services.now()
    if request.outcome == "completed":
        settled = await store.settle_owned(claim, Completed(now))
    elif request.outcome == "failed":
        error = request.error or "failed by the downstream"
        if request.retry_after_ms is None:
            delay = retry_delay_ms(bot, claim.attempt, Outcome("retry"))
        else:
            delay = min(request.retry_after_ms, int(bot.retry_after_cap_seconds * 1000))
        settled = await store.settle_owned(claim, Failed(now, now + delay, error))
    else:
        error = request.error or "exhausted by the downstream"
        if bot.mode == "durable":
            settled = await store.exhaust(claim, now, error)
        else:
            settled = await store.settle_owned(claim, Abandoned(now, error))
    if settled:
        await services.wake()  # the chat's next update, or this retry, may be due
    return Settled(settled=settled)


@router.post("/exhaustions/acknowledge", tags=["operations"])
async def acknowledge(
    request: AcknowledgeRequest, grant: CallbackOrOperator
) -> Acknowledged | AcknowledgedInBulk:
    """Acknowledge the exhaustion with exactly this identity (`bot`, `update_id`, `attempt`,
    `claim_id`): it becomes prunable. Or, with an operator key, every open exhaustion a
    `filter` or a list of `identities` selects (a dry run counts them and changes nothing):
    `{"matched", "acknowledged": n, "sample"}`."""
    claim = request.identity()
    if claim is None:
        return await acknowledge_in_bulk(request, grant)
    # A bot no longer configured may still have exhaustions.
    grant.allow(claim.bot, claim.destination)
    services = grant.services
    acknowledged = await services.store.acknowledge_exhaustion(claim, services.now())
    return Acknowledged(acknowledged=acknowledged)
