"""The `/v1` API: the callback routes a downstream calls (`claims`), the operations reads
(`operations`) and operator control (`control`, its messages `control_messages`), all behind
bearer keys (`deps`). Errors answer `{"error": "..."}`."""

from __future__ import annotations

from collections.abc import Mapping

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from app.api import claims, control, erasures, operations
from app.api.deps import Credentials, Services, authenticated
from app.api.errors import install_errors
from app.api.lean import LeanHandler, lean_handlers
from app.http.keys import Keys

__all__ = ["Keys", "LeanHandler", "Services", "install", "install_errors", "lean"]


def lean() -> Mapping[tuple[str, str], LeanHandler]:
    """The routes the request guard answers directly, by (method, path) (`app.api.lean`)."""
    return lean_handlers(claims.callbacks.routes)


def install(app: FastAPI) -> None:
    """Add the `/v1` routes and the error answers they share to `app`."""
    app.include_router(claims.callbacks)
    app.include_router(claims.router)
    app.include_router(operations.router)
    app.include_router(control.router)
    app.include_router(erasures.router)
    install_errors(app)

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi(request: Request, credentials: Credentials) -> JSONResponse:
        """The OpenAPI document, for any valid key."""
        authenticated(request, credentials)
        return JSONResponse(app.openapi())
