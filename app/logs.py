"""Logging: one JSON object per line in production, readable text in a terminal.

`configure(format)` sets up the root logger once for every command; uvicorn's loggers go
through it too (`server_config` gives uvicorn no logging config of its own). `auto` (the
default) writes text when standard error is a terminal and JSON otherwise, so a container or
a service manager gets JSON without asking.

With tracing on (`app.tracing`), a line logged inside a span carries its `trace_id` and
`span_id` as fields too (`carry_trace_ids`), in W3C's hex, as tracing backends show them.

Lines about one attempt carry its identity as fields (`bot`, `update_id`, `attempt`,
`claim_id`): in JSON as keys of the object, in text as the `bot:update_id attempt N (claim
...)` prefix. Nothing here logs settings: secrets are `SecretStr` and stay out of messages.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any, Literal

from pythonjsonlogger.json import JsonFormatter

LogFormat = Literal["auto", "json", "text"]
TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_JSON_FIELDS = ["levelname", "name", "message"]  # and `timestamp` (ISO 8601, UTC)


def configure(log_format: LogFormat = "auto", level: int | str = logging.INFO) -> None:
    """Send every logger's records to standard error, as text or JSON."""
    as_json = log_format == "json" or (log_format == "auto" and not sys.stderr.isatty())
    handler = logging.StreamHandler(sys.stderr)
    if as_json:
        handler.setFormatter(
            JsonFormatter(
                _JSON_FIELDS,
                rename_fields={"levelname": "level", "name": "logger"},
                timestamp=True,
            )
        )
        handler.addFilter(_without_colour)
    else:
        handler.setFormatter(logging.Formatter(TEXT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request is noise
    # No line of a dependency's may carry what Telegram sent (docs/privacy.md): SQLAlchemy's
    # statement log prints each statement's parameters (bodies among them) and aiosqlite's
    # debug lines the calls it runs, arguments and all. Ours say what happened to which
    # update, by bot, update_id and attempt.
    for name in ("sqlalchemy.engine", "sqlalchemy.pool", "aiosqlite"):
        logging.getLogger(name).setLevel(max(logging.WARNING, root.getEffectiveLevel()))
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []  # propagate to ours
        logging.getLogger(name).propagate = True


def carry_trace_ids(handlers: list[logging.Handler] | None = None) -> None:
    """From now on, a line logged inside a recording span carries its ids (tracing is on),
    through `handlers` (the root logger's: `configure`'s)."""
    for handler in logging.getLogger().handlers if handlers is None else handlers:
        handler.addFilter(_with_trace_ids)


def _with_trace_ids(record: logging.LogRecord) -> bool:
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    if context.is_valid:
        record.trace_id = format(context.trace_id, "032x")
        record.span_id = format(context.span_id, "016x")
    return True


def _without_colour(record: logging.LogRecord) -> bool:
    record.__dict__.pop("color_message", None)  # uvicorn's copy of the message, for terminals
    return True


class AttemptLog(logging.LoggerAdapter[logging.Logger]):
    """A logger for one attempt: its identity on every line, as fields and as a prefix."""

    def __init__(self, logger: logging.Logger, fields: Mapping[str, object]) -> None:
        super().__init__(logger, dict(fields))
        extra = self.extra or {}
        claim = extra.get("claim_id")
        self._prefix = f"{extra.get('bot')}:{extra.get('update_id')} attempt {extra.get('attempt')}"
        if claim is not None:
            self._prefix += f" (claim {claim})"

    @classmethod
    def of(cls, logger: logging.Logger, identity: Any) -> AttemptLog:
        """For an identity (anything with bot, update_id, attempt and claim_id)."""
        fields = ("bot", "update_id", "attempt", "claim_id")
        return cls(logger, {name: getattr(identity, name) for name in fields})

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        kwargs["extra"] = {**(self.extra or {}), **kwargs.get("extra", {})}
        return f"{self._prefix}: {msg}", kwargs
