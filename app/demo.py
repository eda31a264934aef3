"""The demo downstream: a minimal bot handler behind the service, built on the kit.

For each forwarded request it verifies the signature, asks the callback API whether its
attempt still owns the update, and logs what it handles. `telegram-intake demo-downstream`
serves it alone; `telegram-intake run --demo` mounts it in the service's own process, so one
command shows the whole loop: webhook, commit, claim, forward, ownership check, settle.
A real bot does its domain write where this one logs (see `examples/effects_bot`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from app.logs import AttemptLog
from telegram_intake_kit import CallbackError, IntakeClient, Rejected, read_forwarded

log = logging.getLogger("app.demo")


def describe_update(update: dict[str, object]) -> str:
    """A few words on what an update carries."""
    kind = next((key for key in update if key != "update_id"), "empty")
    message = update.get(kind)
    if isinstance(message, dict):
        text = message.get("text") or message.get("data") or message.get("query")
        chat = message.get("chat")
        where = f" in chat {chat.get('id')}" if isinstance(chat, dict) else ""
        if text:
            return f"{kind}{where}: {json.dumps(text)[:80]}"
        return f"{kind}{where}"
    return kind


def demo_downstream(
    *, intake_url: str, api_key: str, signing_secret: str | None, secret_token: str | None
) -> Starlette:
    """The handler as an ASGI app: POST / takes forwarded updates."""
    client = IntakeClient(intake_url, api_key)

    async def handle(request: Request) -> JSONResponse:
        body = await request.body()
        try:
            forwarded = read_forwarded(
                request.headers, body, signing_secret=signing_secret, secret_token=secret_token
            )
        except Rejected as error:
            log.warning("demo downstream: rejected a request: %s", error)
            return JSONResponse({"error": str(error)}, 401)
        what = describe_update(forwarded.update)
        identity = forwarded.identity
        if identity is None:  # a plain bot: no identity to check
            log.info("demo downstream: update %s (%s)", forwarded.update_id, what)
            return JSONResponse({})
        try:
            owned = await client.owns(identity)
        except CallbackError as error:
            log.warning("demo downstream: could not check ownership: %s", error)
            return JSONResponse({"error": "ownership unknown, try again"}, 503)
        if not owned.owned:
            log.info("demo downstream: %s is no longer ours; nothing done", identity.key())
            return JSONResponse({"error": "not the owner"}, 409)
        AttemptLog(log, identity.model_dump()).info(
            "demo downstream: handled, lease until %s: %s", owned.lease_expires_at, what
        )
        return JSONResponse({})

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        yield
        await client.aclose()

    return Starlette(routes=[Route("/", handle, methods=["POST"])], lifespan=lifespan)
