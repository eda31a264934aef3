"""The service's ASGI application: FastAPI, with the webhook answered ahead of it.

Telegram posts one request per update, and FastAPI's way to a route (its middleware, the
router's match through the included routers, dependency solving, a Response sent through every
layer's `send`) costs three times what the intake itself does for it. So `Service` hands each
`POST /telegram/{bot}` straight to its `webhook` (the intake, an ASGI application of its own,
set while the app runs), exactly when FastAPI's router would have matched the webhook's route:
method POST, one non-empty path segment after `/telegram/`, no root path. Every other request,
and every request while no webhook is set (before start-up, after shutdown), takes FastAPI's
way, where the webhook's route answers by the same intake (`app.intake.route`).

What the layers skipped would have done for the webhook is done by the intake itself: the
request guard's refusal of a head with a header twice (`app.http.guard.read_head`), and a JSON
500 with a request id for anything unexpected. The other layers do nothing on that path
(the console's security headers and the `/v1` fault handler keep to their own prefixes).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from app.http.guard import WEBHOOK_PREFIX

__all__ = ["Service"]

_SKIP = len(WEBHOOK_PREFIX)


class Service(FastAPI):
    """The service's FastAPI app; `webhook`, when set, answers the webhook's requests.

    FastAPI's own OpenTelemetry (a span, metrics and logs for each request it routes, once a
    provider is set globally, as `app.tracing` does when tracing is on) stays off: the
    service's traces are one per update (`app.tracing`), not one per health probe or scrape,
    and its metrics are Prometheus's."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("telemetry", {"tracing": False, "metrics": False, "logs": False})
        super().__init__(**kwargs)
        self.webhook: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        webhook = self.webhook
        if (
            webhook is not None
            and scope["type"] == "http"
            and scope["method"] == "POST"
            and not scope.get("root_path")
        ):
            path: str = scope["path"]
            if path.startswith(WEBHOOK_PREFIX) and len(path) > _SKIP and "/" not in path[_SKIP:]:
                await webhook(scope, receive, send)
                return
        await super().__call__(scope, receive, send)
