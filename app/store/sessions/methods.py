"""The console's sessions (revision 0005, docs/security.md), kept in the database so that every
process of the cluster ends a session at once: at sign-out, after its idle time, at the end of
its lifetime. The token itself never reaches the database: callers pass its digest."""

from __future__ import annotations

from sqlalchemy import Table

from app.store import validate
from app.store.core import SqlCore
from app.store.sessions import statements as sessions


class SessionMethods(SqlCore):
    def _sessions(self, feature: str) -> Table:
        return self._needing(self.sessions_table, feature, "0005")

    async def start_session(
        self, session_id: str, *, key_digest: str, at: int, idle_ms: int, lifetime_ms: int
    ) -> None:
        """Keep a new session, started and seen at `at`; ended ones go on the way."""
        table = self._sessions("start_session")
        session_id = validate.text("session_id", session_id)
        key_digest = validate.text("key_digest", key_digest)
        at = validate.millis("at", at)
        idle_ms, lifetime_ms = _bounds(idle_ms, lifetime_ms)
        async with self.transaction() as connection:
            await connection.execute(
                sessions.ended(table, at=at, idle_ms=idle_ms, lifetime_ms=lifetime_ms)
            )
            await connection.execute(
                sessions.start(table, session_id=session_id, key_digest=key_digest, at=at)
            )

    async def find_session(
        self, session_id: str, *, at: int, idle_ms: int, lifetime_ms: int, seen: bool = True
    ) -> str | None:
        """The key digest of a session live at `at` (with `seen`, now marked seen then);
        else None."""
        table = self._sessions("find_session")
        session_id = validate.text("session_id", session_id)
        at = validate.millis("at", at)
        idle_ms, lifetime_ms = _bounds(idle_ms, lifetime_ms)
        build = sessions.seen if validate.flag("seen", seen) else sessions.live
        statement = build(
            table, session_id=session_id, at=at, idle_ms=idle_ms, lifetime_ms=lifetime_ms
        )
        async with self._write() if seen else self._read() as connection:
            digest = (await connection.execute(statement)).scalar_one_or_none()
        return None if digest is None else str(digest)

    async def end_session(self, session_id: str) -> bool:
        """End the session everywhere; False when there was none."""
        table = self._sessions("end_session")
        statement = sessions.end(table, session_id=validate.text("session_id", session_id))
        return await self._changed(statement)


def _bounds(idle_ms: int, lifetime_ms: int) -> tuple[int, int]:
    return validate.positive("idle_ms", idle_ms), validate.positive("lifetime_ms", lifetime_ms)
