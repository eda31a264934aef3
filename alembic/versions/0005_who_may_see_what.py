"""Who may see what (docs/security.md): the bots of each audit entry, the console's sessions.

Adds two tables beside the updates table, each named after it: `_audit_bots` (the bots an
audit entry concerns; a key limited to some bots reads an entry only when every bot it
concerns is one of them) and `_sessions` (the console's sessions, kept server-side so that
sign-out, an idle time or a changed key ends them in every process).

The entries written before this revision get their bots from what each one recorded: its
target for a pause, a resume, a rate limit and a park; the filter's bots or the identities of
a bulk action (a filter that named no bot concerns every bot, and gets no row).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03
"""

from __future__ import annotations

import json
from typing import Any

from alembic import context, op
from sqlalchemy import select

from app.store.schema import audit_table_name, make_metadata

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

SUFFIXES = ("_audit_bots", "_sessions")
BATCH = 1_000


def upgrade() -> None:
    table = context.config.attributes["table"]
    metadata = make_metadata(table, "0005")
    bind = op.get_bind()
    for suffix in SUFFIXES:
        metadata.tables[table + suffix].create(bind)
    audit = metadata.tables[audit_table_name(table)]
    audit_bots = metadata.tables[table + "_audit_bots"]
    rows = bind.execute(select(audit.c.id, audit.c.action, audit.c.target, audit.c.detail))
    pairs = [
        {"audit_id": row.id, "bot": bot}
        for row in rows
        for bot in entry_bots(row.action, row.target, row.detail)
    ]
    for start in range(0, len(pairs), BATCH):
        bind.execute(audit_bots.insert(), pairs[start : start + BATCH])


def entry_bots(action: str, target: str, detail: str | None) -> list[str]:
    """The bots an audit entry written before 0005 concerns, read from what it recorded."""
    if action in ("pause", "resume", "rate_limit"):
        return [target]
    if action == "park":
        return [target.split("/", 1)[0]]
    recorded: dict[str, Any] = json.loads(detail) if detail else {}
    if "identities" in recorded:  # "bot/update_id/attempt" each
        return sorted({key.split("/", 1)[0] for key in recorded["identities"]})
    return sorted(set(recorded.get("filter", {}).get("bots") or ()))


def downgrade() -> None:
    # Nothing of the updates is touched: what goes is which bots each audit entry concerns
    # (the audit log itself stays) and every console session (everyone signs in again).
    table = context.config.attributes["table"]
    for suffix in reversed(SUFFIXES):
        op.drop_table(table + suffix)
