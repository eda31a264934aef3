"""Every statement of the console's sessions (revision 0005's `_sessions`; docs/security.md).

A session is live while it was seen within the idle time and started within the lifetime; the
statement that finds it is the one that marks it seen, so one round trip both checks and
extends it, and a session found ended is never revived.
"""

from __future__ import annotations

from sqlalchemy import Delete, Insert, Table, Update, delete, insert, or_, update
from sqlalchemy.sql.dml import ReturningDelete


def start(sessions: Table, *, session_id: str, key_digest: str, at: int) -> Insert:
    return insert(sessions).values(id=session_id, key_digest=key_digest, started_at=at, seen_at=at)


def ended(sessions: Table, *, at: int, idle_ms: int, lifetime_ms: int) -> Delete:
    """Delete every session that has ended by `at`."""
    s = sessions.c
    return delete(sessions).where(or_(s.seen_at < at - idle_ms, s.started_at < at - lifetime_ms))


def seen(sessions: Table, *, session_id: str, at: int, idle_ms: int, lifetime_ms: int) -> Update:
    """Mark the session seen at `at` if it is live then, RETURNING its key's digest."""
    s = sessions.c
    live = (s.id == session_id, s.seen_at >= at - idle_ms, s.started_at >= at - lifetime_ms)
    return update(sessions).where(*live).values(seen_at=at).returning(s.key_digest)


def end(sessions: Table, *, session_id: str) -> ReturningDelete[tuple[str]]:
    return delete(sessions).where(sessions.c.id == session_id).returning(sessions.c.id)
