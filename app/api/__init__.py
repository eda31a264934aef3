"""The `/v1` API: the callback routes a downstream calls (`claims`) and the operations routes
(`operations`), both behind bearer keys (`deps`). Errors answer `{"error": "..."}`."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from app.api import claims, operations
from app.api.deps import Credentials, Services, authenticated
from app.http.keys import Keys
from app.store import SchemaError, StoreBusy, StoreError, StoreUnavailable

__all__ = ["Keys", "Services", "install", "install_errors"]


def install(app: FastAPI) -> None:
    """Add the `/v1` routes and the error answers they share to `app`."""
    app.include_router(claims.router)
    app.include_router(operations.router)
    install_errors(app)

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi(request: Request, credentials: Credentials) -> JSONResponse:
        """The OpenAPI document, for any valid key."""
        authenticated(request, credentials)
        return JSONResponse(app.openapi())


def install_errors(app: FastAPI) -> None:
    """The `{"error": ...}` answers of refused and failed requests."""

    @app.exception_handler(HTTPException)
    async def http_error(_request: Request, error: HTTPException) -> JSONResponse:
        return JSONResponse({"error": error.detail}, error.status_code, headers=error.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, error: RequestValidationError) -> JSONResponse:
        # A caller without a valid key never gets here: the request guard refused it first.
        problems = []
        for problem in error.errors():
            where = ".".join(str(part) for part in problem["loc"])
            problems.append(f"{where}: {problem['msg']}")
        detail = [{key: p[key] for key in ("loc", "msg", "type")} for p in error.errors()]
        return JSONResponse({"error": "; ".join(problems), "detail": detail}, 422)

    @app.exception_handler(StoreError)
    async def store_error(_request: Request, error: StoreError) -> JSONResponse:
        if isinstance(error, SchemaError):
            return JSONResponse({"error": str(error)}, 409)
        if isinstance(error, StoreUnavailable | StoreBusy):
            return JSONResponse(
                {"error": f"the database is unavailable: {error}"},
                503,
                headers={"Retry-After": "1"},
            )
        return JSONResponse({"error": f"the database refused the request: {error}"}, 500)
