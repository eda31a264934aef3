"""A fake of Telegram's Bot API on an ephemeral port, as far as the service calls it (written from
the Bot API documentation): setWebhook and getWebhookInfo keep the webhook Telegram would keep,
and every call is recorded. A token other than TOKEN is refused with 401, as Telegram does."""

from __future__ import annotations

import threading
import time
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

TOKEN = "123456:AAH-secret-bot-token"


class FakeBotApi:
    """Keeps the webhook Telegram would keep, and what each call asked. Its server runs in
    another thread: `webhook` is replaced whole under the lock."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.webhook: dict[str, Any] = {"url": "", "pending_update_count": 0}
        self._lock = threading.Lock()

    def set_webhook_state(self, **fields: Any) -> None:
        """What getWebhookInfo answers from now on (its fields changed)."""
        with self._lock:
            self.webhook = {**self.webhook, **fields}

    def called(self, method: str) -> int:
        with self._lock:
            return sum(1 for name, _ in self.calls if name == method)

    def app(self) -> Starlette:
        async def method(request: Request) -> JSONResponse:
            if request.path_params["token"] != TOKEN:
                return JSONResponse(
                    {"ok": False, "error_code": 401, "description": "Unauthorized"}, 401
                )
            name = request.path_params["method"]
            body = await request.body()
            params = await request.json() if body else {}
            with self._lock:
                self.calls.append((name, params))
                if name == "setWebhook":
                    self.webhook = {
                        "url": params["url"],
                        "pending_update_count": 3,
                        "max_connections": params.get("max_connections", 40),
                        "allowed_updates": params.get("allowed_updates"),
                        "last_error_date": int(time.time()) - 120,
                        "last_error_message": "Wrong response from the webhook: 503",
                    }
                    return JSONResponse({"ok": True, "result": True})
                if name == "getWebhookInfo":
                    return JSONResponse({"ok": True, "result": self.webhook})
            return JSONResponse(
                {"ok": False, "error_code": 404, "description": "Not Found: method not found"},
                404,
            )

        return Starlette(routes=[Route("/bot{token}/{method}", method, methods=["POST"])])
