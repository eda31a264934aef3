"""The console (docs/contract.md section 10): `/console` on `serve` and `run`, the operator's web
page.

Server-rendered Jinja2 templates (`templates/`) and plain forms; one small script refreshes the
overview (`static/console.js`), and every page reads without it. Sign-in and CSRF are
`session.py`, the security headers, the route class, forms and error pages `forms.py`, the
pages `pages.py` (sign-in, overview, bots, audit), `update_pages.py`, `exhaustion_pages.py`
and `erasure_pages.py`.
The pages and their files ship in the wheel.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from app.config import Settings
from app.console import erasure_pages, exhaustion_pages, pages, update_pages
from app.console.forms import SecurityHeaders
from app.console.session import Sessions
from app.http.keys import Keys

__all__ = ["PREFIX", "install"]

PREFIX = "/console"
HERE = Path(__file__).parent


def install(app: FastAPI, settings: Settings) -> None:
    """Serve the console on `app` (the request guard leaves PREFIX to the console's own
    sign-in: `install_guard(..., mounted=(PREFIX,))`)."""
    templates = Jinja2Templates(directory=HERE / "templates")
    templates.env.filters["iso"] = iso
    templates.env.filters["duration"] = duration
    app.state.console_templates = templates
    app.state.console_sessions = Sessions(settings)
    app.state.console_keys = Keys(settings.api_keys)
    app.include_router(pages.router)
    app.include_router(update_pages.router)
    app.include_router(exhaustion_pages.router)
    app.include_router(erasure_pages.router)
    app.mount(f"{PREFIX}/static", StaticFiles(directory=HERE / "static"), name="console-static")
    # Every answer under PREFIX, the pages' and the static files' and the router's 404s alike.
    app.add_middleware(SecurityHeaders, prefix=PREFIX)


def iso(ms: int) -> str:
    """Epoch ms as an ISO 8601 time in UTC, to the second."""
    moment = datetime.fromtimestamp(ms / 1000, UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def duration(ms: int) -> str:
    """A length of time in words: 850 ms, 12 s, 4 min 3 s, 2 h 5 min, 3 d 4 h."""
    seconds = ms / 1000
    if seconds < 1:
        return f"{ms} ms"
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, seconds = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"
