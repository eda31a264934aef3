"""The key ring's upkeep in the database (revision 0009, docs/privacy.md).

- The registry: each process registers the key it seals under when it starts; a process
  whose ring lacks a key that may still hold values refuses to start (`keys_missing`), so a
  key is never dropped while values need it.
- The count (`count_keys`, the CLI's `keys status`): the values of every sealed column by the
  key each is sealed under, "none" for values stored as they are; it records each key's count,
  and a key counted at 0 may leave the ring.
- The re-encryption (`reencrypt`): every row with a value not under the ring's current key
  (plaintext included) is opened and sealed again, a bounded batch per transaction, one process
  at a time across the cluster; the same pass digests queue keys stored raw and fills in the
  subjects of rows recorded before revision 0009. Each write is guarded by the values it read,
  so a settle or an erasure in between wins and the row is taken on the next pass. A crash
  loses nothing: the next pass finds what is left.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Table, and_, not_

from app.privacy.subjects import subjects_of
from app.store import validate
from app.store.codec import DIGEST_PREFIX, audit_at, body_at, erasure_at, error_at, event_at
from app.store.core import SqlCore
from app.store.errors import MissingKeys, Undecryptable
from app.store.keys import statements as keys
from app.store.keys.statements import NONE

log = logging.getLogger(__name__)

REENCRYPT_BATCH = 500  # rows a re-encryption batch rewrites, at most, per transaction


@dataclass(frozen=True)
class _Sealed:
    """A table's sealed columns, the key that orders its walk, and where each value is bound
    (its associated data, as the store's writers give it)."""

    table: Table
    key: tuple[str, ...]
    columns: dict[str, Callable[[Any], str]]
    binds: tuple[str, ...] = ()  # the columns besides the key that `columns` bind a value to


class KeyMethods(SqlCore):
    def _keys(self, feature: str) -> Table:
        return self._needing(self.keys_table, feature, "0009")

    def _sealed_tables(self) -> list[_Sealed]:
        """Every table with a sealed column, in the order a pass walks them."""
        error = lambda r: error_at(r.bot, r.update_id)  # noqa: E731
        found = [
            _Sealed(
                self.table,
                ("bot", "update_id"),
                {"body": lambda r: body_at(r.bot, r.update_id), "error": error},
            )
        ]
        if self.attempts_table is not None:
            found.append(
                _Sealed(self.attempts_table, ("bot", "update_id", "attempt"), {"error": error})
            )
        if self.events_table is not None:
            where = {"data": lambda r: event_at(r.type, r.created_at)}
            found.append(_Sealed(self.events_table, ("id",), where, ("type", "created_at")))
        if self.audit_table is not None:
            where = {"detail": lambda r: audit_at(r.action, r.at)}
            found.append(_Sealed(self.audit_table, ("id",), where, ("action", "at")))
        if self.erasures_table is not None:
            where = {"subject_sealed": lambda r: erasure_at(r.bot)}
            found.append(_Sealed(self.erasures_table, ("id",), where, ("bot",)))
        return found

    async def register_key(self, *, at: int) -> None:
        """Note the key this store seals under (none without a ring) in the registry."""
        current = self.codec.current_key
        if current is None or self.keys_table is None:
            return
        statement = keys.register_key(
            self.keys_table, self._backend.upsert, key_id=current, at=validate.millis("at", at)
        )
        async with self._write() as connection:
            await connection.execute(statement)

    async def check_key_ring(self, *, at: int) -> None:
        """At a process's start: refuse (MissingKeys, in one line) a ring that lacks a key
        values may still be sealed under; then register the key it seals under."""
        missing = await self.keys_missing()
        if missing:
            held = "no key ring is configured" if self.codec.ring is None else "the ring lacks them"
            raise MissingKeys(
                f"stored values may be sealed under keys {missing}, and {held}: add them "
                "to INTAKE_ENCRYPTION_KEYS (after the key that encrypts), or count them with "
                "`telegram-intake keys status` (docs/privacy.md)"
            )
        await self.register_key(at=at)

    async def keys_missing(self) -> list[str]:
        """The registered key ids this store's ring lacks that may still hold values: sealed
        values it could not open. Empty below revision 0009 (no registry yet)."""
        if self.keys_table is None:
            return []
        ring = () if self.codec.ring is None else self.codec.ring.ids
        async with self._read() as connection:
            rows = (
                await connection.execute(keys.keys_holding_values(self.keys_table, ids=ring))
            ).all()
        return sorted(row.key_id for row in rows)

    async def count_keys(self, *, at: int) -> dict[str, int]:
        """Every stored sealed-column value by the key id it is sealed under, "none" for
        values stored as they are (one scan of each table: an operator's call); each
        registered key's count is recorded, so one counted at 0 can leave the ring."""
        table = self._keys("count_keys")
        totals: dict[str, int] = {NONE: 0}
        async with self._read() as connection:
            for sealed in self._sealed_tables():
                for column in sealed.columns:
                    rows = (await connection.execute(keys.count_values(sealed.table, column))).all()
                    for row in rows:
                        totals[row.key_id] = totals.get(row.key_id, 0) + int(row.stored)
            registered = (await connection.execute(keys.registered(table))).all()
        at = validate.millis("at", at)
        async with self.transaction() as connection:
            for key_id in {row.key_id for row in registered} | (totals.keys() - {NONE}):
                await connection.execute(
                    keys.register_key(table, self._backend.upsert, key_id=key_id, at=at)
                )
                totals[key_id] = stored = totals.get(key_id, 0)
                await connection.execute(keys.counted(table, key_id=key_id, stored=stored, at=at))
        return totals

    async def reencrypt(self, *, limit: int = REENCRYPT_BATCH) -> int:
        """One batch of the re-encryption pass (see the module docstring); the rows it
        rewrote. 0 once a whole pass found nothing left: the pass starts again from the top on
        the next call."""
        limit = validate.positive("limit", limit)
        after = self._reencrypt_after
        for sealed in self._sealed_tables():
            name = sealed.table.name
            if name in after and after[name] is None:
                continue  # walked to its end in this pass
            done, last = await self._reencrypt_batch(sealed, after.get(name), limit)
            after[name] = last
            if done or last is not None:
                return done
        after.clear()  # every table walked to its end: the next call starts a new pass
        return 0

    def _also(self, sealed: _Sealed) -> tuple[list[ColumnElement[bool]], list[str]]:
        """For the updates table: raw queue keys to digest (with a ring), and subjects to fill
        in (revision 0009); the columns to read for them."""
        if sealed.table is not self.table:
            return [], []
        t, also, read = self.table, [], []
        if self.codec.encrypting:
            also.append(and_(t.c.queue_key.is_not(None), not_(keys.digested(t.c.queue_key))))
            read.append("queue_key")
        if "subjects" in t.c:
            also.append(and_(t.c.subjects.is_(None), t.c.erased_at.is_(None)))
            if self.codec.encrypting:  # ids kept as they are before the ring: digested now
                raw = and_(t.c.subjects != " ", not_(t.c.subjects.like(f" {DIGEST_PREFIX}%")))
                also.append(raw)
            read += ["subjects", "queue_key"]
        return also, read

    async def _reencrypt_batch(
        self, sealed: _Sealed, after: tuple[Any, ...] | None, limit: int
    ) -> tuple[int, tuple[Any, ...] | None]:
        also, read = self._also(sealed)
        read = [*read, *sealed.binds]
        statement = keys.stale_rows(
            sealed.table,
            key=sealed.key,
            sealed=list(sealed.columns),
            read=read,
            also=also,
            current=self.codec.current_key,
            after=after,
            limit=limit,
        )
        async with self._read() as connection:
            rows = (await connection.execute(statement)).all()
        if not rows:
            return 0, None
        written = [
            values for row in rows if (values := self._rewritten(sealed, row, read)) is not None
        ]
        last = tuple(getattr(rows[-1], name) for name in sealed.key)
        if written:
            changed = [c for c in written[0] if c.startswith("new_")]
            columns = [c.removeprefix("new_") for c in changed]
            rewrite = keys.rewrite(sealed.table, key=sealed.key, columns=columns)
            async with self.transaction() as connection:
                if not await self._backend.exclusive(connection, sealed.table, "reencrypt"):
                    return 0, after  # another process is on it: try again later
                await connection.execute(rewrite, written)
        return len(written), last if len(rows) == limit else None

    def _rewritten(self, sealed: _Sealed, row: Any, read: Sequence[str]) -> dict[str, Any] | None:
        """The parameters of `keys.rewrite` for one row: every column it writes, old and new;
        None for a row that cannot be opened (logged: it waits for its key)."""
        values: dict[str, Any] = {f"key_{name}": getattr(row, name) for name in sealed.key}
        opened: dict[str, str | None] = {}
        try:
            for column, where in sealed.columns.items():
                stored = getattr(row, column)
                opened[column] = self.codec.open_optional(stored, where(row))
                moved = (
                    None
                    if stored is None or stored == ""
                    else self.codec.seal(opened[column] or "", where(row))
                )
                values[f"old_{column}"] = stored
                values[f"new_{column}"] = stored if moved is None else moved
        except Undecryptable as error:
            key = {name: values[f"key_{name}"] for name in sealed.key}
            log.error("re-encryption: %s %s left as it is: %s", sealed.table.name, key, error)
            return None
        if sealed.table is self.table:
            if "queue_key" in read:
                values["old_queue_key"] = row.queue_key
                values["new_queue_key"] = (
                    row.queue_key
                    if row.queue_key is None or row.queue_key.startswith(DIGEST_PREFIX)
                    else self.codec.digest(row.queue_key)
                )
            if "subjects" in read:
                values["old_subjects"] = row.subjects
                values["new_subjects"] = row.subjects
                if self.codec.encrypting and row.subjects and DIGEST_PREFIX not in row.subjects:
                    ids = [int(subject) for subject in row.subjects.split()]
                    values["new_subjects"] = self._stored_subjects(ids)
                if row.subjects is None and opened.get("body"):
                    try:
                        update = json.loads(opened["body"] or "")
                    except ValueError:
                        update = None
                    if isinstance(update, dict):
                        values["new_subjects"] = self._stored_subjects(subjects_of(update))
        return values
