"""The console's pages of updates (docs/contract.md section 10): the search, one update with its
attempt history, and what an operator does to one update: park its attempt, redrive or acknowledge
its open exhaustion, each by its exact identity.
"""

from __future__ import annotations

import json
from urllib.parse import urlencode

from fastapi import APIRouter, HTTPException, Request, Response

from app.console.forms import (
    ROWS_PER_PAGE,
    ConsoleRoute,
    acting,
    app_services,
    back_to,
    destination_field,
    render_page,
    signed_in,
    telegram_id_field,
    time_field,
    visible_bot,
    visible_bots,
    visible_destinations,
)
from app.store import ClaimIdentity, UpdateFilter
from app.store.types import DEFAULT_DESTINATION, STATES

router = APIRouter(prefix="/console", route_class=ConsoleRoute, include_in_schema=False)

SEARCH_FIELDS = (
    "bot", "destination", "state", "chat", "user", "update_type", "received_after",
    "received_before", "contains",
)  # fmt: skip


@router.get("/updates")
async def updates(request: Request) -> Response:
    session = await signed_in(request)
    query = {name: request.query_params.get(name, "") for name in SEARCH_FIELDS}
    names = visible_bots(request, session)
    chosen_bots = [visible_bot(request, session, query["bot"])] if query["bot"] else names
    user = telegram_id_field(query["user"], "user")
    state = query["state"] or None
    if state is not None and state not in STATES:
        raise HTTPException(400, f"state {state!r} is not one of {', '.join(STATES)}")
    page = None
    cursor = None
    after = request.query_params.get("after")
    if after:
        try:
            at, name, number = after.split(":", 2)
            cursor = (int(at), name, int(number))
        except ValueError:
            raise HTTPException(400, f"after {after!r} is not a page cursor") from None
    if chosen_bots:
        chosen = UpdateFilter(
            bots=tuple(chosen_bots),
            state=state,
            chat=query["chat"] or None,
            update_type=query["update_type"] or None,
            received_after=time_field(query["received_after"], "received after"),
            received_before=time_field(query["received_before"], "received before"),
            contains=query["contains"] or None,
            user=None if user is None else str(user),
            destination=destination_field(request, session, query["destination"]),
        )
        page = await app_services(request).store.search_updates(
            chosen, after=cursor, limit=ROWS_PER_PAGE
        )
    following = None
    if page is not None and page.next is not None:
        filled = {name: value for name, value in query.items() if value}
        place = ":".join(str(part) for part in page.next)
        following = "/console/updates?" + urlencode({**filled, "after": place})
    return render_page(
        request,
        "updates.html",
        session,
        query=query,
        bots=names,
        destinations=visible_destinations(request, session),
        states=STATES,
        rows=[] if page is None else page.items,
        following=following,
    )


@router.get("/updates/{bot}/{update_id}")
async def update(request: Request, bot: str, update_id: int) -> Response:
    session = await signed_in(request)
    name = visible_bot(request, session, bot)
    store = app_services(request).store
    row = await store.get_update(name, update_id)
    if row is None:
        raise HTTPException(404, f"no update {update_id} of bot {name!r} is recorded")
    history = await store.attempt_history(name, update_id) or []
    return render_page(
        request,
        "update.html",
        session,
        row=row,
        body=_pretty(row.body),
        history=history,
        open_exhaustion=row.exhausted_at is not None and row.acknowledged_at is None,
        parkable=row.state in ("processing", "failed") and row.claim_id is not None,
    )


def _pretty(body: str | None) -> str:
    if body is None:
        return ""
    try:
        return json.dumps(json.loads(body), indent=2, ensure_ascii=False, sort_keys=False)
    except ValueError:
        return body


def _identity(form: dict[str, str], bot: str, update_id: int) -> ClaimIdentity:
    try:
        attempt = int(form.get("attempt", ""))
    except ValueError:
        raise HTTPException(400, "attempt: not a number") from None
    destination = form.get("destination", DEFAULT_DESTINATION)
    try:
        return ClaimIdentity(bot, update_id, attempt, form.get("claim_id", ""), destination)
    except ValueError as error:
        raise HTTPException(400, str(error)) from None


@router.post("/updates/{bot}/{update_id}/park")
async def park(request: Request, bot: str, update_id: int) -> Response:
    session, form = await acting(request)
    services = app_services(request)
    identity = _identity(form, visible_bot(request, session, bot), update_id)
    reason = form.get("reason", "").strip()
    if not reason:
        raise HTTPException(400, "reason: say why this update is parked")
    parked = await services.store.park(
        identity, at=services.now(), by=session.key.label, reason=reason
    )
    if not parked:
        raise HTTPException(409, "that attempt no longer holds the update; look again")
    return back_to(f"/console/updates/{bot}/{update_id}")


@router.post("/updates/{bot}/{update_id}/{action}")
async def one_exhaustion(request: Request, bot: str, update_id: int, action: str) -> Response:
    """Redrive or acknowledge the open exhaustion of one update, by its exact identity."""
    session, form = await acting(request)
    services = app_services(request)
    identity = _identity(form, visible_bot(request, session, bot), update_id)
    now, by = services.now(), session.key.label
    if action == "redrive":
        done = await services.store.redrive([identity], at=now, by=by)
        if done.changed:
            await services.wake()
    elif action == "acknowledge":
        done = await services.store.acknowledge_exhaustions([identity], at=now, by=by)
    else:
        raise HTTPException(404, f"no action {action!r}")
    if not done.changed:
        raise HTTPException(409, "that exhaustion is no longer open; look again")
    return back_to(f"/console/updates/{bot}/{update_id}")
