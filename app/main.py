"""The application: an app factory whose lifespan opens the store and closes it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from app import __version__
from app.config import Settings
from app.store import SqlUpdateStore, open_store


def create_app(settings: Settings | None = None) -> FastAPI:
    """Assemble the service; the store opens when the app starts and closes when it stops."""
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = await open_store(settings.database_url, table=settings.table)
        app.state.store = store
        try:
            yield
        finally:
            await store.close()

    app = FastAPI(title="telegram-intake", version=__version__, lifespan=lifespan)

    @app.get("/healthz", tags=["operations"])
    async def healthz() -> dict[str, str]:
        """The process is alive."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["operations"])
    async def readyz(request: Request) -> JSONResponse:
        """The database answers and its schema serves the configured level."""
        store: SqlUpdateStore = request.app.state.store
        try:
            async with store.engine.connect() as connection:
                await connection.execute(text("SELECT 1"))
        except (SQLAlchemyError, OSError) as error:
            return JSONResponse({"status": "unavailable", "error": type(error).__name__}, 503)
        return JSONResponse({"status": "ready", "capability": store.capability})

    return app
