"""Failures: what a client reads in fixed words, what the log keeps in full, under one request id.

When the store fails or something unexpected happens, the client's answer names no host, port,
user, table or driver message (docs/contract.md section 16): it gets a fixed sentence for the kind
of failure and a request id, in the body (`request_id`) and in the `X-Request-Id` header. The log
line carries the same id (the field `request_id` in JSON logs, and in the message) and the
whole detail: the store's message, and for anything unexpected its traceback.

    StoreUnavailable, StoreBusy  503 + Retry-After  "the database is unavailable; retry"  warning
    StorageFull                  503 + Retry-After  the same                                 debug

A full disk's requests are logged at DEBUG: its episode's two lines at ERROR tell operators when
it began and ended, in the database's words (`app.store.storage`), not one line per request.
    SchemaError                  409                the schema needs an operator            error
    any other StoreError         500                "the database refused the request"     error
    any other exception          500                "the server failed ..."  error, traceback

An id is drawn only when a failure is answered: a request that succeeds pays nothing for it.
Our own refusals (HTTPException, validation errors) are not failures: they are our words about
the client's input, and keep them.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass

from app.store import SchemaError, StoreError, StoreUnavailable
from app.store.storage import failure_level

__all__ = [
    "REQUEST_ID_HEADER",
    "Failure",
    "failure_of",
    "logged",
]

log = logging.getLogger(__name__)

REQUEST_ID_HEADER = "X-Request-Id"
UNAVAILABLE = "the database is unavailable; retry"
SCHEMA = (
    "the database's schema cannot serve this request: an operator should look for this "
    "request id in the server's log and run the migrations (`telegram-intake migrate`)"
)
REFUSED = "the database refused the request; the server's log has the detail"
FAULT = "the server failed to answer this request; the server's log has the detail"


@dataclass(frozen=True, slots=True)
class Failure:
    """A failed request as its client is told of it."""

    status: int
    message: str
    request_id: str
    retry_after: int | None = None

    @property
    def body(self) -> dict[str, str]:
        return {"error": self.message, "request_id": self.request_id}

    @property
    def headers(self) -> dict[str, str]:
        headers = {REQUEST_ID_HEADER: self.request_id}
        if self.retry_after is not None:
            headers["Retry-After"] = str(self.retry_after)
        return headers


def logged(
    where: str, error: BaseException, *, level: int = logging.WARNING, traceback: bool = False
) -> str:
    """Log `error` in full, for the request `where` ("POST /v1/claims/settle"), under a new
    request id; the id."""
    request_id = secrets.token_hex(8)
    log.log(
        level,
        "request %s (%r) failed: %s: %s",
        request_id,
        where,
        type(error).__name__,
        error,
        extra={"request_id": request_id},
        exc_info=error if traceback else None,
    )
    return request_id


def failure_of(error: Exception, where: str, *, retry_after: int = 1) -> Failure:
    """`error` of the request `where`, a store's failure or one nothing expected, logged in
    full (see the module); the Failure its client is told of, `retry_after` seconds on a 503."""
    if isinstance(error, StoreUnavailable):  # StoreBusy and StorageFull too
        request_id = logged(where, error, level=failure_level(error))
        return Failure(503, UNAVAILABLE, request_id, retry_after)
    if isinstance(error, SchemaError):
        return Failure(409, SCHEMA, logged(where, error, level=logging.ERROR))
    if isinstance(error, StoreError):
        return Failure(500, REFUSED, logged(where, error, level=logging.ERROR, traceback=True))
    return Failure(500, FAULT, logged(where, error, level=logging.ERROR, traceback=True))
