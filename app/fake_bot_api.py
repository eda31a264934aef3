"""A fake of Telegram's Bot API, as far as the service calls it (written from the Bot API
documentation), for trials (`telegram-intake fake-bot-api`, then `run --poll` against it), the
tests and the benchmarks: setWebhook, deleteWebhook and getWebhookInfo keep the webhook
Telegram would keep, getMe and sendMessage answer as Telegram does (for the framework
adapters' bots), and every call is recorded. A token other than its own is refused with
401, as Telegram does. `POST /fake/updates` (a JSON list of updates) gives it updates to hand
out, as a bot's users would.

getUpdates as Telegram answers it: the updates with `update_id >= offset`, those below the
offset forgotten for good (an offset confirms them), at most `limit`; with nothing to give it
holds the request up to `timeout` seconds. It answers 409 while a webhook is set, and a newer
getUpdates ends one still open with 409 (`terminated by other getUpdates request`). `faults`
makes the next calls answer an error (429 with `retry_after`, 500) or drop the connection.

A method's parameters come as Telegram takes them: a JSON body, a urlencoded form, or
multipart/form-data with files (setWebhook's `certificate`, kept in `certificate`; over 3 MiB it
is refused as Telegram refuses it). setWebhook keeps `ip_address` and `has_custom_certificate`
for getWebhookInfo, as Telegram does; `allowed_updates` as Telegram keeps it: unchanged when
not given, Telegram's default when it names no update type, otherwise its known names in
Telegram's order (getWebhookInfo leaves it out when it is the default)."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import threading
import time
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from app.queues import DEFAULT_UPDATES, QUEUES
from app.webhook_rules import MAX_CERTIFICATE_BYTES

TOKEN = "123456:AAH-secret-bot-token"  # noqa: S105 - the fake's default, a trial token


class FakeBotApi:
    """Keeps the webhook Telegram would keep, and what each call asked. Its server runs in
    another thread: `webhook` is replaced whole under the lock."""

    def __init__(self, token: str = TOKEN) -> None:
        self.token = token
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.webhook: dict[str, Any] = {"url": "", "pending_update_count": 0}
        self.pending: list[dict[str, Any]] = []  # produced, not yet confirmed by an offset
        self.faults: list[tuple[int, float | None]] = []  # (status, retry_after); 0: a drop
        self.conflicts = 0  # getUpdates answered 409
        self.certificate: bytes | None = None  # the last setWebhook's uploaded certificate
        self._polls = 0  # getUpdates calls so far: the newest one is the live one
        self._sent_messages = 0
        self._lock = threading.Lock()

    def produce(self, *updates: dict[str, Any]) -> None:
        """Updates Telegram has for the bot, in order."""
        with self._lock:
            self.pending.extend(updates)

    def set_webhook_state(self, **fields: Any) -> None:
        """What getWebhookInfo answers from now on (its fields changed)."""
        with self._lock:
            self.webhook = {**self.webhook, **fields}

    def me(self) -> dict[str, Any]:
        """getMe's bot: its id is the token's number, as Telegram's is."""
        return {
            "id": int(self.token.split(":", 1)[0]),
            "is_bot": True,
            "first_name": "Intake test bot",
            "username": "intake_test_bot",
            "can_join_groups": True,
            "can_read_all_group_messages": False,
            "supports_inline_queries": False,
        }

    def sent(self) -> list[dict[str, Any]]:
        """sendMessage's calls so far, in the order they came, with chat_id an integer."""
        with self._lock:
            calls = [params for name, params in self.calls if name == "sendMessage"]
        return [{**call, "chat_id": int(call["chat_id"])} for call in calls]

    def _message(self, params: dict[str, Any]) -> dict[str, Any]:
        """The Message sendMessage answers, under the lock."""
        self._sent_messages += 1
        chat = int(params["chat_id"])
        return {
            "message_id": self._sent_messages,
            "date": int(time.time()),
            "chat": {"id": chat, "type": "private" if chat > 0 else "group", "title": "chat"},
            "from": self.me(),
            "text": str(params.get("text", "")),
        }

    def called(self, method: str) -> int:
        with self._lock:
            return sum(1 for name, _ in self.calls if name == method)

    def app(self) -> Starlette:
        async def method(request: Request) -> Response:
            if request.path_params["token"] != self.token:
                return JSONResponse(
                    {"ok": False, "error_code": 401, "description": "Unauthorized"}, 401
                )
            name = request.path_params["method"]
            params = await _parameters(request)
            with self._lock:
                self.calls.append((name, params))
                if name == "setWebhook":
                    return self._set_webhook(params)
                if name == "getWebhookInfo":
                    held = self.webhook.get("pending_update_count", 0) + len(self.pending)
                    info = {**self.webhook, "pending_update_count": held}
                    return JSONResponse({"ok": True, "result": info})
                if name == "getMe":
                    return JSONResponse({"ok": True, "result": self.me()})
                if name == "sendMessage":
                    return JSONResponse({"ok": True, "result": self._message(params)})
                if name == "deleteWebhook":
                    self.webhook = {"url": "", "pending_update_count": 0}
                    if params.get("drop_pending_updates"):
                        self.pending.clear()
                    return JSONResponse({"ok": True, "result": True})
            if name == "getUpdates":
                return await self._get_updates(params)
            return JSONResponse(
                {"ok": False, "error_code": 404, "description": "Not Found: method not found"},
                404,
            )

        async def produced(request: Request) -> JSONResponse:
            batch = await request.json()
            if not isinstance(batch, list) or not all(
                isinstance(u, dict) and isinstance(u.get("update_id"), int) for u in batch
            ):
                return JSONResponse({"error": "a JSON list of updates with update_id"}, 400)
            self.produce(*batch)
            return JSONResponse({"pending": len(self.pending)})

        return Starlette(
            routes=[
                Route("/bot{token}/{method}", method, methods=["POST"]),
                Route("/fake/updates", produced, methods=["POST"]),
            ]
        )

    def _set_webhook(self, params: dict[str, Any]) -> Response:
        """setWebhook, under the lock: a form's fields are strings, as Telegram reads them."""
        certificate = params.get("certificate")
        if isinstance(certificate, bytes) and len(certificate) > MAX_CERTIFICATE_BYTES:
            words = f"Bad Request: certificate size is too big ({len(certificate)} bytes)"
            return JSONResponse({"ok": False, "error_code": 400, "description": words}, 400)
        ip = params.get("ip_address") or None
        if ip is not None:
            try:
                ipaddress.ip_address(ip)
            except ValueError:
                words = "Bad Request: bad webhook: Invalid IP address specified"
                return JSONResponse({"ok": False, "error_code": 400, "description": words}, 400)
        connections = params.get("max_connections", 40)
        self.certificate = certificate if isinstance(certificate, bytes) else None
        self.webhook = {
            "url": params["url"],
            "has_custom_certificate": self.certificate is not None,
            "pending_update_count": 3,
            "max_connections": int(connections) if isinstance(connections, str) else connections,
            "allowed_updates": _allowed_updates(params, self.webhook.get("allowed_updates")),
            "last_error_date": int(time.time()) - 120,
            "last_error_message": "Wrong response from the webhook: 503",
        }
        if ip is not None:
            self.webhook["ip_address"] = ip
        return JSONResponse({"ok": True, "result": True})

    async def _get_updates(self, params: dict[str, Any]) -> Response:
        with self._lock:
            if self.faults:
                status, retry_after = self.faults.pop(0)
                if status == 0:
                    raise ConnectionResetError("a dropped connection")
                body: dict[str, Any] = {"ok": False, "error_code": status, "description": "fault"}
                if retry_after is not None:
                    body["parameters"] = {"retry_after": retry_after}
                return JSONResponse(body, status)
            if self.webhook.get("url"):
                self.conflicts += 1
                return _conflict(
                    "can't use getUpdates method while webhook is active; "
                    "use deleteWebhook to delete the webhook first"
                )
            self._polls += 1
            mine = self._polls
        offset = params.get("offset")
        deadline = time.monotonic() + float(params.get("timeout") or 0)
        while True:
            with self._lock:
                if mine != self._polls:  # a newer getUpdates ended this one
                    self.conflicts += 1
                    return _conflict(
                        "terminated by other getUpdates request; make sure that "
                        "only one bot instance is running"
                    )
                if offset is not None:
                    self.pending = [u for u in self.pending if u["update_id"] >= offset]
                batch = self.pending[: int(params.get("limit") or 100)]
            if batch or time.monotonic() >= deadline:
                return JSONResponse({"ok": True, "result": batch})
            await asyncio.sleep(0.02)


def _conflict(words: str) -> JSONResponse:
    return JSONResponse({"ok": False, "error_code": 409, "description": f"Conflict: {words}"}, 409)


async def _parameters(request: Request) -> dict[str, Any]:
    """A method's parameters: a JSON body, or a form (urlencoded or multipart/form-data: each
    field a string, each file its bytes)."""
    kind = request.headers.get("content-type", "")
    if kind.startswith(("multipart/form-data", "application/x-www-form-urlencoded")):
        async with request.form() as form:
            return {
                name: value if isinstance(value, str) else await value.read()
                for name, value in form.multi_items()
            }
    body = await request.body()
    params: dict[str, Any] = json.loads(body) if body else {}
    return params


def _allowed_updates(params: dict[str, Any], current: list[str] | None) -> list[str] | None:
    """allowed_updates as Telegram keeps it (Client.cpp, get_allowed_update_types): unchanged
    when missing, empty, not a JSON array or holding a non-string; lower-cased, unknown names
    ignored; Telegram's default when no name is known (`[]` too). None stands for the default, which
    getWebhookInfo leaves out; otherwise the names in Telegram's order."""
    given = params.get("allowed_updates")
    if isinstance(given, str):
        try:
            given = json.loads(given) if given else None
        except ValueError:
            return current
    if not isinstance(given, list) or not all(isinstance(n, str) for n in given):
        return current  # missing, empty, not an array: the setting stands
    named = {name.lower() for name in given} & set(QUEUES)
    default = set(DEFAULT_UPDATES)
    if not named or named == default:
        return None
    return [name for name in QUEUES if name in named]
