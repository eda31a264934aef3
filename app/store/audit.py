"""The audit log's writes: one entry per operator action, in the transaction that acts, with
the bots it concerns (revision 0005's `_audit_bots`). Its reads are `app.store.views`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    Insert,
    Table,
    insert,
)


def record_action(audit: Table, **values: Any) -> Insert:
    return insert(audit).values(**values).returning(audit.c.id)


def record_action_bots(audit_bots: Table, audit_id: int, bots: Sequence[str]) -> Insert:
    return insert(audit_bots).values([{"audit_id": audit_id, "bot": bot} for bot in bots])
