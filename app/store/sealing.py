"""Where the store's families meet the codec (`app.store.codec`): every column that holds
personal data is written and read through these, so no family seals or opens a value its own
way, and a new column cannot forget (docs/privacy.md, docs/design.md decision 6).

Each value is bound to its column and row as the codec's associated data, named once for every
writer and reader by `app.store.codec` (`body_at`, `error_at`, `event_at`, `audit_at`,
`erasure_at`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any, overload

from app.store import history
from app.store.codec import Codec, audit_at, body_at, error_at
from app.store.errors import Undecryptable
from app.store.types import DeliveryRow, NewUpdate, RecordedRow, Settlement


class Sealing:
    """The store's personal-data seam: `codec` seals what the families write, opens what they
    read."""

    codec: Codec

    def _stored_rows(
        self, rows: Sequence[NewUpdate]
    ) -> tuple[list[RecordedRow], list[DeliveryRow]]:
        """New rows as stored (bodies sealed, queue keys and subjects digested), and the
        deliveries of their routes beside `default` (revision 0010), each with the row's
        stored queue key where its destination is ordered."""
        codec = self.codec
        stored, deliveries = [], []
        seen: set[tuple[str, int]] = set()  # a key twice in a batch: its first routes count
        for row in rows:
            queue_key = codec.digest_optional(row.queue_key)
            routed = row.to_default
            stored.append(
                RecordedRow(
                    row.bot,
                    row.update_id,
                    codec.seal(row.body, body_at(row.bot, row.update_id)),
                    row.update_type,
                    queue_key,
                    row.received_at,
                    row.trace_context,
                    self._stored_subjects(row.subjects),
                    "pending" if routed else "unrouted",
                    None if routed else row.received_at,
                )
            )
            key = (row.bot, row.update_id)
            if key in seen:
                continue
            seen.add(key)
            for route in row.elsewhere:
                deliveries.append(
                    DeliveryRow(
                        row.bot,
                        route.destination,
                        row.update_id,
                        queue_key if route.ordered else None,
                        row.received_at,
                    )
                )
        return stored, deliveries

    def _stored_subjects(self, subjects: Sequence[int]) -> str:
        """The `subjects` column: each id as stored, between spaces (a LIKE finds one); " "
        for an update that names no one (NULL is kept for rows recorded before 0009)."""
        return " " + "".join(self.codec.digest(str(subject)) + " " for subject in subjects)

    def _body(self, row: Any) -> str:
        """A read row's body (bot, update_id, body), opened."""
        return self.codec.open(row.body, body_at(row.bot, row.update_id))

    def _body_or_why(self, row: Any) -> tuple[str, str | None]:
        """A claimed row's body, or ("", why not) when the ring cannot open it: a worker ends
        that attempt, and goes on with the others."""
        try:
            return self._body(row), None
        except Undecryptable as error:
            return "", str(error)

    @overload
    def _sealed_error(self, bot: str, update_id: int, error: str) -> str: ...
    @overload
    def _sealed_error(self, bot: str, update_id: int, error: str | None) -> str | None: ...
    def _sealed_error(self, bot: str, update_id: int, error: str | None) -> str | None:
        """An attempt's error as the row and its history store it: an excerpt (the history's
        length, `history.MAX_ERROR_CHARS`), sealed. A downstream's answer may echo its user's
        words; the row and its history share the one value."""
        stored = history.excerpt(error)
        return self.codec.seal_optional(stored, error_at(bot, update_id))

    def _error(self, row: Any) -> str | None:
        """A read row's error (bot, update_id, error), opened; what kept it from opening, in
        brackets, when the ring cannot (an operator's listing goes on past it)."""
        try:
            return self.codec.open_optional(row.error, error_at(row.bot, row.update_id))
        except Undecryptable as error:
            return f"[unreadable: {error}]"

    def _sealed_settlement(self, settlement: Settlement, bot: str, update_id: int) -> Settlement:
        """`settlement` with its error as `_sealed_error` stores it."""
        error = getattr(settlement, "error", None)
        if error is None:
            return settlement
        sealed = self._sealed_error(bot, update_id, error)
        return dataclasses.replace(settlement, error=sealed)

    def _audit_detail(self, row: Any) -> str | None:
        """A read audit entry's detail (action, at, detail), opened: a filter may name a chat
        or quote a body."""
        try:
            return self.codec.open_optional(row.detail, audit_at(row.action, row.at))
        except Undecryptable as error:
            return json.dumps({"unreadable": str(error)})
