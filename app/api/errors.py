"""The `{"error": ...}` answers of refused and failed requests: the app's exception handlers
answer with them (`install_errors`), and so does a lean route (`app.api.lean`), which runs
without those handlers around it.

A refusal (HTTPException, a validation error) keeps its words: they are ours, about the
client's input. A failure (the store's, or an exception nothing expected) is answered in fixed
words with a request id, its detail in the log under that id (`app.http.failures`).
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.http.failures import Failure, failure_of
from app.store import StoreError

__all__ = ["error_answer", "install_errors"]

API_PREFIX = "/v1/"


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


def failed(failure: Failure) -> JSONResponse:
    return JSONResponse(failure.body, failure.status, headers=failure.headers)


def _where(method: str, path: str) -> str:
    return f"{method} {path}"


def error_answer(error: Exception, request: Request) -> JSONResponse:
    """The answer to `error`, raised while answering `request`."""
    if isinstance(error, HTTPException):
        return refused(error)
    if isinstance(error, RequestValidationError):
        return invalid(error)
    return failed(failure_of(error, _where(request.method, request.url.path)))


class Faults:
    """An exception nothing expected, raised by a `/v1` route before it answered: a JSON 500
    with a request id, the traceback in the log (Starlette's own answer is text, and its
    traceback, logged by the server, has no id)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(API_PREFIX):
            await self.app(scope, receive, send)
            return
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception as error:
            if started:
                raise  # half an answer is out: the server can only drop the connection
            answer = failed(failure_of(error, _where(scope["method"], scope["path"])))
            await answer(scope, receive, send)


def install_errors(app: FastAPI) -> None:
    """Answer `app`'s refused and failed requests with `{"error": ...}`."""

    @app.exception_handler(HTTPException)
    async def http_error(_request: Request, error: HTTPException) -> JSONResponse:
        return refused(error)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request: Request, error: RequestValidationError) -> JSONResponse:
        return invalid(error)

    @app.exception_handler(StoreError)
    async def store_error(request: Request, error: StoreError) -> JSONResponse:
        return error_answer(error, request)

    app.add_middleware(Faults)
