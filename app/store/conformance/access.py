"""Rules for who may see what (the durable level from revision 0005; docs/security.md): the
audit log read within some bots, and the console's sessions, which end at sign-out, after their
idle time and at the end of their lifetime."""

from __future__ import annotations

from collections.abc import Awaitable

from app.store.conformance._core import BOT, OTHER_BOT, _Findings, _rule
from app.store.conformance.control import OPERATOR, _exhausted
from app.store.contract import OperatorStore
from app.store.operator_types import AuditEntry, ExhaustionFilter

THIRD_BOT = "conformance-c"


@_rule("the audit log within some bots shows only entries of none but them", "durable")
async def _audit_within_bots(store: OperatorStore, f: _Findings) -> None:
    both = [await _exhausted(store, 1), await _exhausted(store, 2, bot=OTHER_BOT)]
    await store.pause(BOT, at=100, by=OPERATOR, reason="ours")
    await store.pause(OTHER_BOT, at=101, by=OPERATOR, reason="theirs")
    await store.acknowledge_exhaustions(both, at=102, by=OPERATOR)  # one entry, two bots
    await store.redrive(ExhaustionFilter(chat="none"), at=103, by=OPERATOR)  # every bot
    await store.resume(BOT, at=104, by=OPERATOR)

    def seen(entries: list[AuditEntry]) -> list[int]:
        return [entry.at for entry in entries]

    f.equal(seen(await store.audit_log(limit=10)), [104, 103, 102, 101, 100], "every bot's key")
    f.equal(seen(await store.audit_log(limit=10, bots=[BOT])), [104, 100], "one bot's key")
    f.equal(
        seen(await store.audit_log(limit=10, bots=[OTHER_BOT, THIRD_BOT])),
        [101],
        "another bot's key",
    )
    f.equal(
        seen(await store.audit_log(limit=10, bots=[BOT, OTHER_BOT])),
        [104, 102, 101, 100],
        "a key of both: the entry of both, not the one of every bot",
    )
    f.equal(seen(await store.audit_log(limit=10, bots=[])), [], "a key of no bot")
    first = await store.audit_log(limit=1, bots=[BOT])
    if first:
        page = await store.audit_log(after=first[0].id, limit=5, bots=[BOT])
        f.equal(seen(page), [100], "the page after the first, within the bot")


IDLE, LIFETIME = 1_000, 10_000


@_rule("a console session lives until sign-out, its idle time or its lifetime", "durable")
async def _sessions(store: OperatorStore, f: _Findings) -> None:
    def find(session: str, at: int) -> Awaitable[str | None]:
        return store.find_session(session, at=at, idle_ms=IDLE, lifetime_ms=LIFETIME)

    await store.start_session("a", key_digest="key-1", at=0, idle_ms=IDLE, lifetime_ms=LIFETIME)
    await store.start_session("b", key_digest="key-2", at=0, idle_ms=IDLE, lifetime_ms=LIFETIME)
    f.equal(await find("a", 1_000), "key-1", "a session at the end of its idle time")
    f.equal(await find("nobody", 1_000), None, "a session never started")
    f.equal(await find("b", 1_001), None, "a session idle past its time")
    f.equal(await find("a", 1_900), "key-1", "a session kept alive by its requests")
    looked = await store.find_session("a", at=2_800, idle_ms=IDLE, lifetime_ms=LIFETIME, seen=False)
    f.equal(looked, "key-1", "a session looked at, not seen")
    unseen = await store.find_session("a", at=2_901, idle_ms=IDLE, lifetime_ms=LIFETIME, seen=False)
    f.equal(unseen, None, "a session only looked at since its idle time began")
    await store.start_session(
        "a2", key_digest="key-1", at=2_000, idle_ms=IDLE, lifetime_ms=LIFETIME
    )
    for at in range(2_800, 12_001, 900):
        await find("a2", at)
    f.equal(await find("a2", 12_000), "key-1", "a session at the end of its lifetime")
    f.equal(await find("a2", 12_001), None, "a session past its lifetime, however busy")
    await store.start_session(
        "c", key_digest="key-1", at=20_000, idle_ms=IDLE, lifetime_ms=LIFETIME
    )
    f.equal(await store.end_session("c"), True, "a sign-out")
    f.equal(await find("c", 20_001), None, "the session after its sign-out")
    f.equal(await store.end_session("c"), False, "a second sign-out")
