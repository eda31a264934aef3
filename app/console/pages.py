"""The console's pages (docs/contract.md section 10): server-rendered, every read a plain GET,
every action a POSTed form with its CSRF token, each standing on the same store methods as the
`/v1` API. Here: sign-in, the overview, the bots (pause, resume, rate limit) and the audit log; the
updates are `update_pages.py`, the exhaustions `exhaustion_pages.py`.

A viewer key sees every page and no action: the forms are left out of its pages, and a POST
made by hand is refused (`app.console.forms.acting`). Each action is recorded in the audit log
under the key's name, as from the API.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, HTTPException, Request, Response
from starlette.responses import RedirectResponse

from app.console.forms import (
    ROWS_PER_PAGE,
    ConsoleRoute,
    acting,
    app_services,
    back_to,
    bot_destination,
    read_form,
    render_page,
    sessions,
    signed_in,
    visible_bot,
    visible_bots,
)
from app.console.session import Session
from app.http.keys import Keys
from app.http.throttle import AuthThrottle
from app.overview import bots_overview
from app.store.operator_types import BotControl
from app.store.types import STATES

router = APIRouter(prefix="/console", route_class=ConsoleRoute, include_in_schema=False)

HOUR_MS = 3_600_000
MINUTE_MS = 60_000


# -- sign-in ---------------------------------------------------------------------------------


@router.get("/sign-in")
async def sign_in_form(request: Request) -> Response:
    return render_page(request, "sign_in.html", None, problem=None)


@router.post("/sign-in")
async def sign_in(request: Request) -> Response:
    form = await read_form(request)
    # The guard's throttle (`app.http.throttle`), checked and counted with no await between,
    # so that a flood of sign-ins sent at once cannot all pass the check before one counts.
    throttle: AuthThrottle = request.app.state.auth_throttle
    source = throttle.source(request.scope)
    if wait := throttle.retry_after(source):
        problem = f"Too many failed sign-ins from your address: wait {wait} s, then try again."
        response = render_page(request, "sign_in.html", None, problem=problem)
        response.status_code = 429
        response.headers["retry-after"] = str(wait)
        return response
    keys: Keys = request.app.state.console_keys
    given = form.get("key", "").strip()
    key = keys.find(given)
    if key is None and given:  # an empty field guesses nothing
        throttle.failed(source)
    if key is None or not key.may("viewer") or not key.whole_bots:
        problem = "That key is not valid here." if key is None else "That key may not view."
        if key is not None and not key.whole_bots:
            problem = "That key is limited to destinations: the console needs whole bots."
        response = render_page(request, "sign_in.html", None, problem=problem)
        response.status_code = 401
        return response
    redirect = RedirectResponse("/console", status_code=303)
    await sessions(request).sign_in(redirect, request, key, app_services(request))
    return redirect


@router.post("/sign-out")
async def sign_out(request: Request) -> Response:
    session = await signed_in(request)
    form = await read_form(request)
    if not sessions(request).csrf_matches(session, form.get("csrf")):
        raise HTTPException(403, "this form has expired or did not come from this console")
    redirect = RedirectResponse("/console/sign-in", status_code=303)
    await sessions(request).sign_out(redirect, session, app_services(request))
    return redirect


# -- overview --------------------------------------------------------------------------------


async def _overview(request: Request, session: Session) -> dict[str, Any]:
    services = app_services(request)
    names = visible_bots(request, session)
    now = services.now()
    bots = await bots_overview(services.store, services.settings, names, now)
    since = now - HOUR_MS
    slots = await services.store.activity(
        names, since=since - since % MINUTE_MS, until=now, slot_ms=MINUTE_MS
    )
    per_bot: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for slot in slots:
        per_bot[slot.bot].append((slot.received, slot.delivered))
    return {"bots": bots, "charts": {b: chart(per_bot[b]) for b in names}, "states": STATES}


@router.get("")
async def overview(request: Request) -> Response:
    session = await signed_in(request)
    return render_page(request, "overview.html", session, **await _overview(request, session))


@router.get("/overview.part")
async def overview_part(request: Request) -> Response:
    """The overview's live part, which the page's script fetches again every few seconds: not
    a person's request, so it does not keep the session from going idle."""
    session = await signed_in(request, seen=False)
    return render_page(request, "overview_part.html", session, **await _overview(request, session))


def chart(counts: list[tuple[int, int]], width: int = 240, height: int = 48) -> dict[str, Any]:
    """A small line chart of updates in and delivered per minute, as SVG polyline points."""
    top = max((max(pair) for pair in counts), default=0) or 1
    step = width / max(len(counts) - 1, 1)

    def points(index: int) -> str:
        return " ".join(
            f"{i * step:.1f},{height - pair[index] * height / top:.1f}"
            for i, pair in enumerate(counts)
        )

    return {
        "received": points(0),
        "delivered": points(1),
        "width": width,
        "height": height,
        "top": top,
        "received_total": sum(pair[0] for pair in counts),
        "delivered_total": sum(pair[1] for pair in counts),
    }


# -- bots ------------------------------------------------------------------------------------


@router.get("/bots")
async def bots(request: Request) -> Response:
    session = await signed_in(request)
    services = app_services(request)
    names = visible_bots(request, session)
    found = await bots_overview(services.store, services.settings, names, services.now())
    controls = {
        (control.bot, control.destination): control
        for control in await services.store.bot_controls(names, destinations=True)
    }
    # Each bot's destinations beside `default`, with their own controls (defaults if never
    # touched); every destination, `default` too, for the replay form.
    destinations = {
        bot.name: [
            controls.get((bot.name, target.name), BotControl(bot.name, destination=target.name))
            for target in bot.targets
            if not target.default
        ]
        for bot in services.settings.bots
        if bot.name in names
    }
    targets = {bot.name: [t.name for t in bot.targets] for bot in services.settings.bots}
    return render_page(
        request, "bots.html", session, bots=found, destinations=destinations, targets=targets
    )


@router.post("/bots/{bot}/pause")
async def pause(request: Request, bot: str) -> Response:
    session, form = await acting(request)
    services = app_services(request)
    name = visible_bot(request, session, bot)
    destination = bot_destination(request, session, name, form.get("destination", ""))
    reason = form.get("reason", "").strip() or None
    await services.store.pause(
        name, at=services.now(), by=session.key.label, reason=reason, destination=destination
    )
    return back_to("/console/bots")


@router.post("/bots/{bot}/resume")
async def resume(request: Request, bot: str) -> Response:
    session, form = await acting(request)
    services = app_services(request)
    name = visible_bot(request, session, bot)
    destination = bot_destination(request, session, name, form.get("destination", ""))
    if await services.store.resume(
        name, at=services.now(), by=session.key.label, destination=destination
    ):
        await services.wake()
    return back_to("/console/bots")


@router.post("/bots/{bot}/rate-limit")
async def rate_limit(request: Request, bot: str) -> Response:
    session, form = await acting(request)
    services = app_services(request)
    name = visible_bot(request, session, bot)
    given = form.get("per_second", "").strip()
    try:
        rate = None if given in ("", "off") else float(given)
    except ValueError:
        raise HTTPException(400, f"per second: {given!r} is not a number") from None
    destination = bot_destination(request, session, name, form.get("destination", ""))
    await services.store.set_rate_limit(
        name, rate, at=services.now(), by=session.key.label, destination=destination
    )
    await services.wake()
    return back_to("/console/bots")


@router.post("/bots/{bot}/replay")
async def replay(request: Request, bot: str) -> Response:
    """A range of update ids delivered to a destination that never had them; a dry run
    first (the button the page shows), then the act, each told on the page."""
    session, form = await acting(request)
    services = app_services(request)
    name = visible_bot(request, session, bot)
    destination = bot_destination(request, session, name, form.get("destination", ""))
    configured = services.settings.bot(name)
    target = None if configured is None else configured.target(destination)
    ordered = target is None or target.ordered
    try:
        first, last = int(form.get("first", "")), int(form.get("last", ""))
    except ValueError:
        raise HTTPException(400, "first and last: update ids, as whole numbers") from None
    dry_run = form.get("dry_run") == "yes"
    try:
        count = await services.store.replay(
            name,
            destination,
            first=first,
            last=last,
            ordered=ordered,
            at=services.now(),
            by=session.key.label,
            dry_run=dry_run,
        )
    except ValueError as error:
        raise HTTPException(400, str(error)) from None
    if count and not dry_run:
        await services.wake()
    told = {"replayed": str(count), "bot": name, "destination": destination}
    told |= {"first": str(first), "last": str(last)} | ({"dry_run": "yes"} if dry_run else {})
    return back_to("/console/bots?" + urlencode(told))


# -- audit -----------------------------------------------------------------------------------


@router.get("/audit")
async def audit(request: Request) -> Response:
    session = await signed_in(request)
    after = request.query_params.get("after")
    try:
        cursor = int(after) if after else None
    except ValueError:
        raise HTTPException(400, f"after {after!r} is not a page cursor") from None
    entries = await app_services(request).store.audit_log(
        after=cursor, limit=ROWS_PER_PAGE, bots=session.key.bots
    )
    following = f"/console/audit?after={entries[-1].id}" if len(entries) == ROWS_PER_PAGE else None
    return render_page(request, "audit.html", session, entries=entries, following=following)
