"""The console's pages of exhaustions (docs/contract.md section 10): the open ones by filter, a bulk
redrive or acknowledgement previewed as a dry run, then confirmed with the count it showed.
"""

from __future__ import annotations

from urllib.parse import urlencode

from fastapi import APIRouter, HTTPException, Request, Response

from app.api.control_messages import Filter
from app.console.forms import (
    ConsoleRoute,
    acting,
    app_services,
    back_to,
    destination_field,
    render_page,
    signed_in,
    time_field,
    visible_bot,
    visible_bots,
    visible_destinations,
)
from app.console.session import Session
from app.store import ExhaustionFilter
from app.store.types import DEFAULT_DESTINATION

router = APIRouter(prefix="/console", route_class=ConsoleRoute, include_in_schema=False)

FILTER_FIELDS = (
    "bot", "update_type", "chat", "error_contains", "exhausted_after", "exhausted_before",
)  # fmt: skip


def _exhaustion_filter(
    request: Request, session: Session, fields: dict[str, str]
) -> ExhaustionFilter:
    """The form's filter as the API reads one (`Filter`), within the key's bots."""
    criteria: dict[str, object] = {name: fields.get(name) or None for name in FILTER_FIELDS}
    for name in ("exhausted_after", "exhausted_before"):
        criteria[name] = time_field(fields.get(name, ""), name.replace("_", " "))
    destination = destination_field(request, session, fields.get("destination", ""))
    criteria["destination"] = destination or DEFAULT_DESTINATION
    chosen = Filter.model_validate(criteria)
    visible = visible_bots(request, session)
    return chosen.within((visible_bot(request, session, chosen.bot),) if chosen.bot else visible)


@router.get("/exhaustions")
async def exhaustions(request: Request) -> Response:
    """Open exhaustions by filter; with `preview` (redrive or acknowledge), the dry run's
    count and sample and a form that confirms that count."""
    session = await signed_in(request)
    query = {name: request.query_params.get(name, "") for name in (*FILTER_FIELDS, "destination")}
    store = app_services(request).store
    chosen = _exhaustion_filter(request, session, query)
    preview = request.query_params.get("preview") or None
    if preview not in (None, "redrive", "acknowledge"):
        raise HTTPException(400, f"preview {preview!r} is not redrive or acknowledge")
    dry = await store.redrive(chosen, at=app_services(request).now(), by="console", dry_run=True)
    return render_page(
        request,
        "exhaustions.html",
        session,
        query=query,
        bots=visible_bots(request, session),
        destinations=visible_destinations(request, session),
        matched=dry.matched,
        sample=dry.sample,
        preview=preview,
        named=any(query[name] for name in FILTER_FIELDS),  # a destination chooses no rows
    )


@router.post("/exhaustions/{action}")
async def exhaustions_in_bulk(request: Request, action: str) -> Response:
    """A confirmed bulk action: it takes what the filter selects now, and says if that is not
    the count the person confirmed."""
    session, form = await acting(request)
    services = app_services(request)
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
    filled = {name: form[name] for name in (*FILTER_FIELDS, "destination") if form.get(name)}
    outcome = {"done": action, "count": str(done.changed), "confirmed": form.get("count", "")}
    return back_to("/console/exhaustions?" + urlencode({**filled, **outcome}))
