"""What the console's sessions offer their users."""

from __future__ import annotations

from typing import Protocol


class Sessions(Protocol):
    """The console's server-side sessions (revision 0005)."""

    async def start_session(
        self, session_id: str, *, key_digest: str, at: int, idle_ms: int, lifetime_ms: int
    ) -> None:
        """Keep a new console session `session_id` (a digest of its token) for the key whose
        digest is `key_digest`, started and seen at `at`; sessions that ended by `at` (idle
        past `idle_ms`, or started over `lifetime_ms` ago) are deleted on the way."""
        ...

    async def find_session(
        self, session_id: str, *, at: int, idle_ms: int, lifetime_ms: int, seen: bool = True
    ) -> str | None:
        """The key digest of session `session_id` if it is live at `at` (seen within
        `idle_ms`, started within `lifetime_ms`), with `seen` marking it seen at `at`; None
        for a session that ended, was never started, or was ended by `end_session`."""
        ...

    async def end_session(self, session_id: str) -> bool:
        """End the session in every process at once (sign-out); False when there was none."""
        ...
