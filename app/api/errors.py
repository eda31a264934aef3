"""The `{"error": ...}` answers of refused and failed requests, one function per kind of
failure: the app's exception handlers answer with them (`install_errors`), and so does a lean
route (`app.api.lean`), which runs without those handlers around it."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from app.store import SchemaError, StoreBusy, StoreError, StoreUnavailable

__all__ = ["error_answer", "install_errors"]


def refused(error: HTTPException) -> JSONResponse:
    return JSONResponse({"error": error.detail}, error.status_code, headers=error.headers)


def invalid(error: RequestValidationError) -> JSONResponse:
    # A caller without a valid key never gets here: the request guard refused it first.
    problems = []
    for problem in error.errors():
        where = ".".join(str(part) for part in problem["loc"])
        problems.append(f"{where}: {problem['msg']}")
    detail = [{key: p[key] for key in ("loc", "msg", "type")} for p in error.errors()]
    return JSONResponse({"error": "; ".join(problems), "detail": detail}, 422)


def store_failed(error: StoreError) -> JSONResponse:
    if isinstance(error, SchemaError):
        return JSONResponse({"error": str(error)}, 409)
    if isinstance(error, StoreUnavailable | StoreBusy):
        return JSONResponse(
            {"error": f"the database is unavailable: {error}"}, 503, headers={"Retry-After": "1"}
        )
    return JSONResponse({"error": f"the database refused the request: {error}"}, 500)


def error_answer(error: Exception) -> JSONResponse | None:
    """The answer to `error`, or None for an error nothing here answers (a 500)."""
    if isinstance(error, HTTPException):
        return refused(error)
    if isinstance(error, RequestValidationError):
        return invalid(error)
    if isinstance(error, StoreError):
        return store_failed(error)
    return None


def install_errors(app: FastAPI) -> None:
    """Answer `app`'s refused and failed requests with `{"error": ...}`."""

    @app.exception_handler(HTTPException)
    async def http_error(_request: Request, error: HTTPException) -> JSONResponse:
        return refused(error)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request: Request, error: RequestValidationError) -> JSONResponse:
        return invalid(error)

    @app.exception_handler(StoreError)
    async def store_error(_request: Request, error: StoreError) -> JSONResponse:
        return store_failed(error)
