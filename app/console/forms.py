"""The console's plumbing: the security headers of every answer under its path
(`SecurityHeaders`), its route class (a POST from another site refused, refusals and failures
answered as error pages), reading a form (bounded, URL-encoded only, its time fields), the
signed-in session every page needs and the bots its key may see, and answers that are pages
(a page, an error page, a redirect after an action)."""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, urlsplit

from fastapi import HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.responses import RedirectResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.deps import Services
from app.console.session import Session, Sessions
from app.http.failures import Failure, failure_of
from app.http.sources import Network, came_over_https, client_address
from app.store import validate
from app.store.types import DEFAULT_DESTINATION

ROWS_PER_PAGE = 50  # a page of search results or of the audit log
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
    # Not no-referrer: under it a browser sends `Origin: null` with the console's own forms,
    # which `from_elsewhere` must refuse. same-origin tells other sites nothing either.
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}
CROSS_SITE = "this form was sent from another site: open the console itself and send it there"
DEFAULT_PORTS = {"http": 80, "https": 443}


class SecurityHeaders:
    """ASGI middleware: every answer whose path is `prefix` or under it carries SECURITY_HEADERS,
    whoever made it (a page, an error page, the router's 404 and 405, FastAPI's 422, a static
    file), in place of any the answer had of the same names."""

    def __init__(self, app: ASGIApp, prefix: str) -> None:
        self.app = app
        self._path = prefix.rstrip("/")
        self._under = f"{self._path}/"
        self._headers = [
            (name.encode(), value.encode()) for name, value in SECURITY_HEADERS.items()
        ]
        self._names = {name for name, _ in self._headers}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not (path == self._path or path.startswith(self._under)):
            await self.app(scope, receive, send)
            return

        async def secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [
                    (n, v) for n, v in message.get("headers", ()) if n.lower() not in self._names
                ]
                message = {**message, "headers": [*kept, *self._headers]}
            await send(message)

        await self.app(scope, receive, secured)


class ConsoleRoute(APIRoute):
    """A console route: a POST from another site is refused before anything is done
    (`from_elsewhere`); refusals and failures are error pages, a failure's in fixed words with
    a request id, its detail in the log under it (`app.http.failures`)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def answer(request: Request) -> Response:
            if request.method == "POST" and from_elsewhere(request):
                return error_page(request, 403, CROSS_SITE)
            try:
                return await handler(request)
            except SignInNeeded:
                return RedirectResponse("/console/sign-in", status_code=303)
            except HTTPException as error:
                return error_page(request, error.status_code, str(error.detail))
            except RequestValidationError:
                raise  # a path parameter that is not one: the app's 422
            except ValueError as error:  # what the store refuses: bad input changes nothing
                return error_page(request, 400, str(error))
            except Exception as error:  # the store's failures, and what nothing expected
                failure = failure_of(error, f"{request.method} {request.url.path}")
                return error_page(request, failure.status, failure.message, failure)

        return answer


def from_elsewhere(request: Request) -> bool:
    """Whether a POST came from another site, by what the browser says of it: `Sec-Fetch-Site`
    cross-site or same-site, or an `Origin` that is not the console's own (`null` included).
    A request with neither header (curl, an old browser) passes: the SameSite=Strict cookie
    and each form's CSRF token guard it still."""
    site = request.headers.get("sec-fetch-site", "").strip().lower()
    if site in ("cross-site", "same-site"):
        return True
    # A browser sets Sec-Fetch-Site itself (no page can): when it says same-origin, that is
    # the answer, whatever a proxy did to Host on the way (nginx's default rewrites it).
    if site in ("same-origin", "none"):
        return False
    origin = request.headers.get("origin")
    if origin is None:
        return False
    theirs = _site(origin)
    return theirs is None or theirs != _site(_own_origin(request))


def _own_origin(request: Request) -> str:
    """The console's origin as the browser sees it: the request's scheme and Host; behind a
    proxy of `trusted_proxies`, HTTPS when it says so (X-Forwarded-Proto) and its
    X-Forwarded-Host when it sends one (the last hop's word; others' are never read)."""
    proxies: Sequence[Network] = request.app.state.settings.trusted_proxies
    peer = request.client.host if request.client else None
    forwarded_proto = request.headers.get("x-forwarded-proto")
    https = came_over_https(request.url.scheme, peer, forwarded_proto, proxies)
    host = request.headers.get("host", "")
    forwarded_host = request.headers.get("x-forwarded-host")
    if forwarded_host and _from_proxy(peer, proxies):
        host = forwarded_host.split(",")[-1].strip()
    return f"{'https' if https else 'http'}://{host}"


def _from_proxy(peer: str | None, proxies: Sequence[Network]) -> bool:
    address = client_address(peer, None, ())  # the peer itself, read as the allowlists read it
    return address is not None and any(address in network for network in proxies)


def _site(origin: str) -> tuple[str, str, int] | None:
    """An origin's scheme, host and port (the scheme's default filled in); None for what is
    not an origin (`null`, another scheme, a path, user info, a bad port)."""
    parts = urlsplit(origin.strip())
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        return None
    extra = parts.path or parts.query or parts.fragment or "@" in parts.netloc
    if scheme not in DEFAULT_PORTS or not parts.hostname or extra:
        return None
    return scheme, parts.hostname, port or DEFAULT_PORTS[scheme]


class SignInNeeded(Exception):
    """No valid session: the page sends the person to sign in."""


def sessions(request: Request) -> Sessions:
    found: Sessions = request.app.state.console_sessions
    return found


def app_services(request: Request) -> Services:
    """The app's services: its settings, its store, its clock."""
    found: Services = request.app.state.services
    return found


def visible_bots(request: Request, session: Session) -> list[str]:
    """The configured bots this session's key may see."""
    return [bot.name for bot in app_services(request).settings.bots if session.allows(bot.name)]


def visible_bot(request: Request, session: Session, name: str) -> str:
    """`name`, if the session's key may see that bot; 404 otherwise."""
    if name not in visible_bots(request, session):
        raise HTTPException(404, f"no bot {name!r} is configured for this key")
    return name


def visible_destinations(request: Request, session: Session) -> list[str]:
    """Every destination of the bots this session's key may see, `default` first."""
    names = {
        target.name
        for bot in app_services(request).settings.bots
        if session.allows(bot.name)
        for target in bot.targets
    }
    return sorted(names, key=lambda name: (name != DEFAULT_DESTINATION, name))


def destination_field(request: Request, session: Session, value: str) -> str | None:
    """A form's destination: None when empty, 404 for one no bot of the key has."""
    if not value:
        return None
    if value not in visible_destinations(request, session) and value != DEFAULT_DESTINATION:
        raise HTTPException(404, f"no destination {value!r} is configured for this key")
    return value


def bot_destination(request: Request, session: Session, bot: str, value: str) -> str:
    """The destination a bot action names (empty: `default`, the bot); 404 for one `bot`
    lacks."""
    name = visible_bot(request, session, bot)
    if not value or value == DEFAULT_DESTINATION:
        return DEFAULT_DESTINATION
    configured = app_services(request).settings.bot(name)
    if configured is None or configured.target(value) is None:
        raise HTTPException(404, f"bot {name!r} has no destination {value!r}")
    return value


async def signed_in(request: Request, *, seen: bool = True) -> Session:
    """The request's session (`seen`: a person's request, which keeps it from going idle);
    SignInNeeded without one. Kept on the request for its error page, which shows who is
    signed in without asking the database again."""
    session = await sessions(request).of(request, request.app.state.services, seen=seen)
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


def telegram_id_field(value: str, name: str) -> int | None:
    """A user's or a chat's id field: empty, or an integer (negative for groups and channels)."""
    value = value.strip()
    if not value:
        return None
    digits = value.removeprefix("-")
    if not digits.isdigit() or len(digits) > 19:
        raise HTTPException(400, f"{name}: {value[:40]!r} is not a Telegram id (an integer)")
    return int(value)


def time_field(value: str, name: str) -> int | None:
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


def render_page(
    request: Request, template: str, session: Session | None, **context: Any
) -> Response:
    """A page: `template` with `context` and the signed-in `session` (None: nobody)."""
    templates = request.app.state.console_templates
    response: Response = templates.TemplateResponse(
        request, template, {"session": session, **context}
    )
    return response


def error_page(
    request: Request, status: int, message: str, failure: Failure | None = None
) -> Response:
    """The error page; for a failure, with its request id (on the page and in X-Request-Id)."""
    templates = request.app.state.console_templates
    session = getattr(request.state, "console_session", None)
    request_id = None if failure is None else failure.request_id
    context = {"status": status, "message": message, "session": session, "request_id": request_id}
    response: Response = templates.TemplateResponse(
        request,
        "error.html",
        context,
        status_code=status,
        headers=None if failure is None else failure.headers,
    )
    return response


def back_to(url: str) -> RedirectResponse:
    """After an action: see the page it changed (303, so a reload does not post again)."""
    return RedirectResponse(url, status_code=303)
