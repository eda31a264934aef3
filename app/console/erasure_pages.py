"""The console's erasure on request (docs/privacy.md): a user's or a chat's id, the dry run's
counts, then the erasure confirmed with them, and the job as it goes on. The id travels in
POSTed forms only, never in a URL (which access logs keep)."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, HTTPException, Request, Response

from app.console.forms import (
    ConsoleRoute,
    acting,
    app_services,
    back_to,
    render_page,
    signed_in,
    telegram_id_field,
    visible_bot,
    visible_bots,
)
from app.dispatch.privacy import worked_until_done
from app.store.operator_types import Erasure

router = APIRouter(prefix="/console", route_class=ConsoleRoute, include_in_schema=False)

COUNT_WITHIN_SECONDS = 10.0  # a dry run the console waits for before it says "counting"


@router.get("/erasures")
async def erasures(request: Request) -> Response:
    session = await signed_in(request)
    return render_page(
        request, "erasures.html", session, bots=visible_bots(request, session), job=None
    )


def _subject(form: dict[str, str]) -> tuple[Literal["user", "chat"], int]:
    kind: Literal["user", "chat"]
    if form.get("kind") == "user":
        kind = "user"
    elif form.get("kind") == "chat":
        kind = "chat"
    else:
        raise HTTPException(400, "choose whose updates: a user's or a chat's")
    subject = telegram_id_field(form.get("subject", ""), f"{kind} id")
    if subject is None:
        raise HTTPException(400, f"{kind} id: give the id of whose updates to erase")
    return kind, subject


@router.post("/erasures/count")
async def count(request: Request) -> Response:
    """The dry run: how many updates, attempts and events the erasure would take now."""
    session, form = await acting(request)
    bot = visible_bot(request, session, form.get("bot", ""))
    kind, subject = _subject(form)
    services = app_services(request)
    store = services.store
    dry = await store.request_erasure(
        bot, kind=kind, subject=subject, at=services.now(), by=session.key.label, dry_run=True
    )
    job = await worked_until_done(store, dry, services.now, within=COUNT_WITHIN_SECONDS)
    return render_page(
        request,
        "erasures.html",
        session,
        bots=visible_bots(request, session),
        job=job,
        confirm={"bot": bot, "kind": kind, "subject": str(subject)},
    )


@router.post("/erasures")
async def erase(request: Request) -> Response:
    """The confirmed erasure: a durable job the workers run; its page follows it."""
    session, form = await acting(request)
    bot = visible_bot(request, session, form.get("bot", ""))
    kind, subject = _subject(form)
    services = app_services(request)
    erasure_id = await services.store.request_erasure(
        bot, kind=kind, subject=subject, at=services.now(), by=session.key.label
    )
    return back_to(f"/console/erasures/{erasure_id}")


@router.get("/erasures/{erasure_id}")
async def erasure(request: Request, erasure_id: int) -> Response:
    session = await signed_in(request)
    job: Erasure | None = await app_services(request).store.get_erasure(erasure_id)
    if job is None or job.bot not in visible_bots(request, session):
        raise HTTPException(404, f"no erasure {erasure_id}")
    return render_page(
        request, "erasures.html", session, bots=visible_bots(request, session), job=job
    )
