"""The connection limits of one server (`app.http.server` enforces them, and its docstring
says what each one does): from the settings, and within the open files the process may have."""

from __future__ import annotations

import logging
import resource
from collections.abc import Callable
from dataclasses import dataclass

from app.config import Settings
from app.metric_labels import CloseReason

__all__ = ["ConnectionLimits"]

# The server's lines, under the one name log filters know them by.
log = logging.getLogger("app.http.server")

# File descriptors kept for what is not a client connection: the database pool, the
# forwarding client's connections, log files, the listening sockets.
RESERVED_DESCRIPTORS = 512


@dataclass(frozen=True)
class ConnectionLimits:
    """What one server allows each client connection (`app.http.server`'s table). The
    defaults are the settings' own: `ConnectionLimits.of(Settings())`, or `defaults()`."""

    header_timeout_seconds: float
    body_timeout_seconds: float
    keep_alive_seconds: int
    max_header_bytes: int
    max_headers: int
    connection_limit: int
    # Told of every connection the limits close (the metrics' counter).
    on_close: Callable[[CloseReason], None] | None = None

    @classmethod
    def defaults(cls) -> ConnectionLimits:
        """The limits of a service configured with nothing but defaults."""
        return cls.of(Settings.model_construct())

    @classmethod
    def of(
        cls, settings: Settings, on_close: Callable[[CloseReason], None] | None = None
    ) -> ConnectionLimits:
        """The limits `settings` names."""
        return cls(
            header_timeout_seconds=settings.header_timeout_seconds,
            body_timeout_seconds=settings.body_timeout_seconds,
            keep_alive_seconds=settings.keep_alive_seconds,
            max_header_bytes=settings.max_header_bytes,
            max_headers=settings.max_headers,
            connection_limit=settings.connection_limit,
            on_close=on_close,
        )

    def usable_connection_limit(self) -> int:
        """`connection_limit`, within what the process may open: the soft limit on open files
        is raised toward the hard one as far as needed, and the limit lowered below what
        remains (uvicorn would otherwise stop accepting, for everyone, when files run out)."""
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        wanted = self.connection_limit + RESERVED_DESCRIPTORS
        if soft != resource.RLIM_INFINITY and soft < wanted:
            raised = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
                soft = raised
            except (ValueError, OSError):
                pass
        if soft == resource.RLIM_INFINITY or soft >= wanted:
            return self.connection_limit
        usable = max(soft - RESERVED_DESCRIPTORS, 16)
        log.warning(
            "connection_limit %d lowered to %d: the process may open %d files",
            self.connection_limit,
            usable,
            soft,
        )
        return usable
