"""The console's plumbing: its route class (security headers on every answer), reading a form
(bounded, URL-encoded only), the signed-in session every page needs, and answers that are pages
(an error page, a redirect after an action)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any
from urllib.parse import parse_qs

from fastapi import HTTPException, Request, Response
from fastapi.routing import APIRoute
from starlette.responses import RedirectResponse

from app.console.session import Session, Sessions
from app.store import StoreError

log = logging.getLogger(__name__)

MAX_FORM_BYTES = 16 << 10  # the largest console form: a filter and a token
FORM_TYPE = "application/x-www-form-urlencoded"
# No inline script or style anywhere: the page's own files only; never inside a frame.
SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}


class ConsoleRoute(APIRoute):
    """A console route: every answer, an error's too, carries the security headers."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def secured(request: Request) -> Response:
            try:
                response = await handler(request)
            except SignInNeeded:
                response = RedirectResponse("/console/sign-in", status_code=303)
            except HTTPException as error:
                response = error_page(request, error.status_code, str(error.detail))
            except ValueError as error:  # what the store refuses: bad input changes nothing
                response = error_page(request, 400, str(error))
            except StoreError as error:
                log.warning("console: %s", error)
                response = error_page(request, 503, "the database is unavailable; try again")
            response.headers.update(SECURITY_HEADERS)
            return response

        return secured


class SignInNeeded(Exception):
    """No valid session: the page sends the person to sign in."""


def sessions(request: Request) -> Sessions:
    found: Sessions = request.app.state.console_sessions
    return found


async def signed_in(request: Request) -> Session:
    """The request's session; SignInNeeded without one. Kept on the request for its error
    page, which shows who is signed in without asking the database again."""
    session = await sessions(request).of(request, request.app.state.services)
    if session is None:
        raise SignInNeeded
    request.state.console_session = session
    return session


async def read_form(request: Request) -> dict[str, str]:
    """A URL-encoded form of at most MAX_FORM_BYTES (each field's first value): 415 for
    another type, 413 past the bound, read no further than it."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != FORM_TYPE:
        raise HTTPException(415, f"a form is sent as {FORM_TYPE}")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise HTTPException(413, "the form is too large")
    try:
        fields = parse_qs(body.decode(), keep_blank_values=True, max_num_fields=64)
    except (UnicodeDecodeError, ValueError):
        raise HTTPException(400, "the form could not be read") from None
    return {name: values[0] for name, values in fields.items()}


async def acting(request: Request) -> tuple[Session, dict[str, str]]:
    """A POSTed action's session and form: its CSRF token must be this session's (403), and
    its key must hold the operator scope (403)."""
    session = await signed_in(request)
    form = await read_form(request)
    if not Sessions.csrf_matches(session, form.get("csrf")):
        raise HTTPException(403, "this form has expired or did not come from this console")
    if not session.may_act:
        raise HTTPException(403, "this key may view, not act (it lacks the operator scope)")
    return session, form


def error_page(request: Request, status: int, message: str) -> Response:
    templates = request.app.state.console_templates
    session = getattr(request.state, "console_session", None)
    context = {"status": status, "message": message, "session": session}
    response: Response = templates.TemplateResponse(
        request, "error.html", context, status_code=status
    )
    return response


def back_to(url: str) -> RedirectResponse:
    """After an action: see the page it changed (303, so a reload does not post again)."""
    return RedirectResponse(url, status_code=303)
