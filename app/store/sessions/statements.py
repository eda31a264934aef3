"""Every statement of the console's sessions (revision 0005's `_sessions`; docs/security.md).

A session is live while it was seen within the idle time and started within the lifetime; the
statement that finds it is the one that marks it seen, so one round trip both checks and
extends it, and a session found ended is never revived.
"""

from __future__ import annotations

from sqlalchemy import (
    ColumnElement,
    Delete,
    Insert,
    Select,
    Table,
    Update,
    delete,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.sql.dml import ReturningDelete


def start(sessions: Table, *, session_id: str, key_digest: str, at: int) -> Insert:
    return insert(sessions).values(id=session_id, key_digest=key_digest, started_at=at, seen_at=at)


def ended(sessions: Table, *, at: int, idle_ms: int, lifetime_ms: int) -> Delete:
    """Delete every session that has ended by `at`."""
    s = sessions.c
    return delete(sessions).where(or_(s.seen_at < at - idle_ms, s.started_at < at - lifetime_ms))


def _is_live(
    sessions: Table, *, session_id: str, at: int, idle_ms: int, lifetime_ms: int
) -> tuple[ColumnElement[bool], ...]:
    s = sessions.c
    return (s.id == session_id, s.seen_at >= at - idle_ms, s.started_at >= at - lifetime_ms)


def seen(sessions: Table, *, session_id: str, at: int, idle_ms: int, lifetime_ms: int) -> Update:
    """Mark the session seen at `at` if it is live then, RETURNING its key's digest."""
    live = _is_live(
        sessions, session_id=session_id, at=at, idle_ms=idle_ms, lifetime_ms=lifetime_ms
    )
    return update(sessions).where(*live).values(seen_at=at).returning(sessions.c.key_digest)


def live(
    sessions: Table, *, session_id: str, at: int, idle_ms: int, lifetime_ms: int
) -> Select[tuple[str]]:
    """The session's key digest if it is live at `at`, leaving it as it was."""
    found = _is_live(
        sessions, session_id=session_id, at=at, idle_ms=idle_ms, lifetime_ms=lifetime_ms
    )
    return select(sessions.c.key_digest).where(*found)


def end(sessions: Table, *, session_id: str) -> ReturningDelete[tuple[str]]:
    return delete(sessions).where(sessions.c.id == session_id).returning(sessions.c.id)
