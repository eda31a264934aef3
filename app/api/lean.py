"""Lean routes: the callbacks a downstream makes on every update, answered without the
framework's per-request machinery.

A downstream asks `owns` before each domain write, so the callback API sees as many requests
as the workers deliver updates, and FastAPI's path for one request (middleware layers, the
router's match, dependency solving, the answer's model) costs several times the statement
behind it. A `LeanRoute` is declared as any route is, and FastAPI documents it from the same
signature; what answers it is one function that does, in FastAPI's order, what FastAPI would:

1. the body, read by the strict JSON reader when it is declared JSON (400 if it is not JSON);
2. the key's grant (`Granted.grant`: 401, 403);
3. the one body model, validated by FastAPI's own field for it (422, the same errors);
4. the endpoint, called with the model and the grant; its refusals, the store's failures and
   any exception nothing expected answered as the app's handlers answer them
   (`app.api.errors`: a failure in fixed words with a request id, its detail in the log).

FastAPI's router runs that function for the route (`get_route_handler`), and the request
guard calls it directly for the exact method and path, ahead of the router and the middleware
inside the guard (`lean_handlers`, `app.http.guard`): one way to answer, whichever way in.
"""

from __future__ import annotations

import email.message
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any

from fastapi import HTTPException, Request, Response
from fastapi._compat import get_missing_field_error
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as Refused

from app.api.deps import Granted
from app.api.errors import error_answer
from app.http.strict_json import NotJson, read_json

__all__ = ["LeanHandler", "LeanRoute", "lean_handlers"]

LeanHandler = Callable[[Request], Coroutine[Any, Any, Response]]
BODY = ("body",)
EMPTY = object()  # no body at all (JSON `null` is a body)


def _declared_json(request: Request) -> bool:
    """Whether the body is declared JSON, as FastAPI decides it (`application/json` or
    `application/*+json`; no Content-Type is not JSON)."""
    value = request.headers.get("content-type")
    if not value:
        return False
    message = email.message.Message()
    message["content-type"] = value
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )


async def _body(request: Request) -> Any:
    """The body's JSON value, its bytes when it is not declared JSON, or EMPTY."""
    try:
        raw = await request.body()
    except Refused:
        raise  # the guard's size limit (413)
    except Exception:
        raise HTTPException(400, "There was an error parsing the body") from None
    if not raw:
        return EMPTY
    if not _declared_json(request):
        return raw
    try:
        return read_json(raw)[1]
    except NotJson as error:
        raise HTTPException(400, str(error)) from None
    except Exception:  # as FastAPI answers any other failure to read a JSON body
        raise HTTPException(400, "There was an error parsing the body") from None


class LeanRoute(APIRoute):
    """A route whose endpoint takes one body model and one grant (`Callback` and the like) and
    answers a `Response` itself; see the module."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(path, endpoint, **kwargs)
        dependant = self.dependant
        grants = [(d.name, d.call) for d in dependant.dependencies if isinstance(d.call, Granted)]
        if len(dependant.body_params) != 1 or len(grants) != 1 or dependant.query_params:
            raise TypeError(f"a lean route takes one body model and one grant: {path}")
        self._field = dependant.body_params[0]
        ((grant_name, self._granted),) = grants
        self._grant_name = str(grant_name)
        self._endpoint = endpoint

    def get_route_handler(self) -> LeanHandler:
        return self.answer

    async def answer(self, request: Request) -> Response:
        try:
            return await self._answer(request)
        except Exception as error:
            return error_answer(error, request)

    async def _answer(self, request: Request) -> Response:
        value = await _body(request)
        grant = self._granted.grant(request)
        if value is EMPTY:
            errors = [get_missing_field_error(BODY)]
        else:
            value, errors = self._field.validate(value, {}, loc=BODY)
        if errors:
            raise RequestValidationError(errors)
        response = await self._endpoint(**{self._field.name: value, self._grant_name: grant})
        if not isinstance(response, Response):
            raise TypeError(f"a lean endpoint answers a Response: {self.path}")
        return response


def lean_handlers(routes: Iterable[Any]) -> Mapping[tuple[str, str], LeanHandler]:
    """The lean routes among `routes`, by (method, path): what the request guard answers
    directly."""
    return {
        (method, route.path): route.answer
        for route in routes
        if isinstance(route, LeanRoute)
        for method in route.methods or ()
    }
