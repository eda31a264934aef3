"""The console's pages (SPEC section 10): server-rendered, every read a plain GET, every action a
POSTed form with its CSRF token, each standing on the same store methods as the `/v1` API.

A viewer key sees every page and no action: the forms are left out of its pages, and a POST
made by hand is refused (`app.console.forms.acting`). Each action is recorded in the audit log
under the key's name, as from the API.
"""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, HTTPException, Request, Response
from starlette.responses import RedirectResponse

from app.api.control import Filter
from app.api.deps import Services
from app.console.forms import ConsoleRoute, acting, back_to, read_form, sessions, signed_in
from app.console.session import Session
from app.http.keys import Keys
from app.http.throttle import AuthThrottle
from app.overview import bots_overview
from app.store import ClaimIdentity, ExhaustionFilter, UpdateFilter, validate
from app.store.types import STATES

router = APIRouter(prefix="/console", route_class=ConsoleRoute, include_in_schema=False)

PAGE = 50  # rows a page
HOUR_MS = 3_600_000
MINUTE_MS = 60_000


def _services(request: Request) -> Services:
    found: Services = request.app.state.services
    return found


def _page(request: Request, template: str, session: Session | None, **context: Any) -> Response:
    templates = request.app.state.console_templates
    response: Response = templates.TemplateResponse(
        request, template, {"session": session, **context}
    )
    return response


def _visible(request: Request, session: Session) -> list[str]:
    """The configured bots this session's key may see."""
    return [bot.name for bot in _services(request).settings.bots if session.allows(bot.name)]


def _bot(request: Request, session: Session, name: str) -> str:
    if name not in _visible(request, session):
        raise HTTPException(404, f"no bot {name!r} is configured for this key")
    return name


# -- sign-in ---------------------------------------------------------------------------------


@router.get("/sign-in")
async def sign_in_form(request: Request) -> Response:
    return _page(request, "sign_in.html", None, problem=None)


@router.post("/sign-in")
async def sign_in(request: Request) -> Response:
    form = await read_form(request)
    # The guard's throttle (`app.http.throttle`), checked and counted with no await between,
    # so that a flood of sign-ins sent at once cannot all pass the check before one counts.
    throttle: AuthThrottle = request.app.state.auth_throttle
    source = throttle.source(request.scope)
    if wait := throttle.retry_after(source):
        problem = f"Too many failed sign-ins from your address: wait {wait} s, then try again."
        response = _page(request, "sign_in.html", None, problem=problem)
        response.status_code = 429
        response.headers["retry-after"] = str(wait)
        return response
    keys: Keys = request.app.state.console_keys
    given = form.get("key", "").strip()
    key = keys.find(given)
    if key is None and given:  # an empty field guesses nothing
        throttle.failed(source)
    if key is None or not key.may("viewer"):
        problem = "That key is not valid here." if key is None else "That key may not view."
        response = _page(request, "sign_in.html", None, problem=problem)
        response.status_code = 401
        return response
    redirect = RedirectResponse("/console", status_code=303)
    await sessions(request).sign_in(redirect, request, key, _services(request))
    return redirect


@router.post("/sign-out")
async def sign_out(request: Request) -> Response:
    session = await signed_in(request)
    form = await read_form(request)
    if not sessions(request).csrf_matches(session, form.get("csrf")):
        raise HTTPException(403, "this form has expired or did not come from this console")
    redirect = RedirectResponse("/console/sign-in", status_code=303)
    await sessions(request).sign_out(redirect, session, _services(request))
    return redirect


# -- overview --------------------------------------------------------------------------------


async def _overview(request: Request, session: Session) -> dict[str, Any]:
    services = _services(request)
    names = _visible(request, session)
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
    return _page(request, "overview.html", session, **await _overview(request, session))


@router.get("/overview.part")
async def overview_part(request: Request) -> Response:
    """The overview's live part, which the page's script fetches again every few seconds: not
    a person's request, so it does not keep the session from going idle."""
    session = await signed_in(request, seen=False)
    return _page(request, "overview_part.html", session, **await _overview(request, session))


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
    services = _services(request)
    names = _visible(request, session)
    found = await bots_overview(services.store, services.settings, names, services.now())
    return _page(request, "bots.html", session, bots=found)


@router.post("/bots/{bot}/pause")
async def pause(request: Request, bot: str) -> Response:
    session, form = await acting(request)
    services = _services(request)
    name = _bot(request, session, bot)
    reason = form.get("reason", "").strip() or None
    await services.store.pause(name, at=services.now(), by=session.key.label, reason=reason)
    return back_to("/console/bots")


@router.post("/bots/{bot}/resume")
async def resume(request: Request, bot: str) -> Response:
    session, _ = await acting(request)
    services = _services(request)
    if await services.store.resume(
        _bot(request, session, bot), at=services.now(), by=session.key.label
    ):
        await services.wake()
    return back_to("/console/bots")


@router.post("/bots/{bot}/rate-limit")
async def rate_limit(request: Request, bot: str) -> Response:
    session, form = await acting(request)
    services = _services(request)
    name = _bot(request, session, bot)
    given = form.get("per_second", "").strip()
    try:
        rate = None if given in ("", "off") else float(given)
    except ValueError:
        raise HTTPException(400, f"per second: {given!r} is not a number") from None
    await services.store.set_rate_limit(name, rate, at=services.now(), by=session.key.label)
    await services.wake()
    return back_to("/console/bots")


# -- updates ---------------------------------------------------------------------------------

SEARCH_FIELDS = (
    "bot", "state", "chat", "update_type", "received_after", "received_before", "contains",
)  # fmt: skip


def _when(value: str, name: str) -> int | None:
    """A time field: empty, epoch ms, or an ISO 8601 date and time (UTC unless it says)."""
    value = value.strip()
    if not value:
        return None
    if value.isdigit():
        return validate.millis(name, int(value))
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise HTTPException(400, f"{name}: {value!r} is not a time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


@router.get("/updates")
async def updates(request: Request) -> Response:
    session = await signed_in(request)
    query = {name: request.query_params.get(name, "") for name in SEARCH_FIELDS}
    names = _visible(request, session)
    chosen_bots = [_bot(request, session, query["bot"])] if query["bot"] else names
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
            received_after=_when(query["received_after"], "received after"),
            received_before=_when(query["received_before"], "received before"),
            contains=query["contains"] or None,
        )
        page = await _services(request).store.search_updates(chosen, after=cursor, limit=PAGE)
    following = None
    if page is not None and page.next is not None:
        filled = {name: value for name, value in query.items() if value}
        place = ":".join(str(part) for part in page.next)
        following = "/console/updates?" + urlencode({**filled, "after": place})
    return _page(
        request,
        "updates.html",
        session,
        query=query,
        bots=names,
        states=STATES,
        rows=[] if page is None else page.items,
        following=following,
    )


@router.get("/updates/{bot}/{update_id}")
async def update(request: Request, bot: str, update_id: int) -> Response:
    session = await signed_in(request)
    name = _bot(request, session, bot)
    store = _services(request).store
    row = await store.get_update(name, update_id)
    if row is None:
        raise HTTPException(404, f"no update {update_id} of bot {name!r} is recorded")
    history = await store.attempt_history(name, update_id) or []
    return _page(
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
    return ClaimIdentity(bot, update_id, attempt, form.get("claim_id", ""))


@router.post("/updates/{bot}/{update_id}/park")
async def park(request: Request, bot: str, update_id: int) -> Response:
    session, form = await acting(request)
    services = _services(request)
    identity = _identity(form, _bot(request, session, bot), update_id)
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
    services = _services(request)
    identity = _identity(form, _bot(request, session, bot), update_id)
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


# -- exhaustions -----------------------------------------------------------------------------

FILTER_FIELDS = (
    "bot", "update_type", "chat", "error_contains", "exhausted_after", "exhausted_before",
)  # fmt: skip


def _exhaustion_filter(
    request: Request, session: Session, fields: dict[str, str]
) -> ExhaustionFilter:
    """The form's filter as the API reads one (`Filter`), within the key's bots."""
    criteria: dict[str, object] = {name: fields.get(name) or None for name in FILTER_FIELDS}
    for name in ("exhausted_after", "exhausted_before"):
        criteria[name] = _when(fields.get(name, ""), name.replace("_", " "))
    chosen = Filter.model_validate(criteria)
    visible = _visible(request, session)
    return chosen.within((_bot(request, session, chosen.bot),) if chosen.bot else visible)


@router.get("/exhaustions")
async def exhaustions(request: Request) -> Response:
    """Open exhaustions by filter; with `preview` (redrive or acknowledge), the dry run's
    count and sample and a form that confirms that count."""
    session = await signed_in(request)
    query = {name: request.query_params.get(name, "") for name in FILTER_FIELDS}
    store = _services(request).store
    chosen = _exhaustion_filter(request, session, query)
    preview = request.query_params.get("preview") or None
    if preview not in (None, "redrive", "acknowledge"):
        raise HTTPException(400, f"preview {preview!r} is not redrive or acknowledge")
    dry = await store.redrive(chosen, at=_services(request).now(), by="console", dry_run=True)
    return _page(
        request,
        "exhaustions.html",
        session,
        query=query,
        bots=_visible(request, session),
        matched=dry.matched,
        sample=dry.sample,
        preview=preview,
        named=any(query.values()),
    )


@router.post("/exhaustions/{action}")
async def exhaustions_in_bulk(request: Request, action: str) -> Response:
    """A confirmed bulk action: it takes what the filter selects now, and says if that is not
    the count the person confirmed."""
    session, form = await acting(request)
    services = _services(request)
    chosen = _exhaustion_filter(request, session, form)
    if not any(form.get(name) for name in FILTER_FIELDS) and form.get("all") != "yes":
        raise HTTPException(400, "name what to act on with a filter, or confirm every one")
    now, by = services.now(), session.key.label
    if action == "redrive":
        rate = form.get("rate_per_second", "").strip()
        try:
            per_second = float(rate) if rate else None
        except ValueError:
            raise HTTPException(400, f"rate per second: {rate!r} is not a number") from None
        done = await services.store.redrive(chosen, at=now, by=by, rate_per_second=per_second)
        if done.changed:
            await services.wake()
    elif action == "acknowledge":
        done = await services.store.acknowledge_exhaustions(chosen, at=now, by=by)
    else:
        raise HTTPException(404, f"no action {action!r}")
    filled = {name: form[name] for name in FILTER_FIELDS if form.get(name)}
    outcome = {"done": action, "count": str(done.changed), "confirmed": form.get("count", "")}
    return back_to("/console/exhaustions?" + urlencode({**filled, **outcome}))


# -- audit -----------------------------------------------------------------------------------


@router.get("/audit")
async def audit(request: Request) -> Response:
    session = await signed_in(request)
    after = request.query_params.get("after")
    try:
        cursor = int(after) if after else None
    except ValueError:
        raise HTTPException(400, f"after {after!r} is not a page cursor") from None
    entries = await _services(request).store.audit_log(
        after=cursor, limit=PAGE, bots=session.key.bots
    )
    following = f"/console/audit?after={entries[-1].id}" if len(entries) == PAGE else None
    return _page(request, "audit.html", session, entries=entries, following=following)
