"""Rules for erasure on request (the durable level from revision 0009; docs/privacy.md): every
update naming the subject in any role goes with its history and its events, nothing else does,
a held attempt loses its claim, a dry run only counts, and a job taken over goes on where it
stopped."""

from __future__ import annotations

import contextlib
import json
from typing import Any

from app.store.conformance._core import BOT, MAX, OTHER_BOT, _Findings, _rule
from app.store.contract import OperatorStore
from app.store.operator_types import UpdateFilter
from app.store.types import Completed, Failed, NewUpdate

ERASER = "conformance-eraser"
ALICE, BOB, GROUP = 5_001, 5_002, -1_005_003


def _person(user: int) -> dict[str, Any]:
    return {"id": user, "is_bot": False, "first_name": f"user{user}"}


def _update(update_id: int, message: dict[str, Any]) -> NewUpdate:
    """An update with the subjects the intake reads off it (`app.privacy.subjects`)."""
    from app.privacy.subjects import subjects_of

    update = {"update_id": update_id, "message": {"message_id": update_id, **message}}
    chat = message.get("chat", {}).get("id")
    queue = None if chat is None else str(chat)
    return NewUpdate(
        BOT, update_id, json.dumps(update), update_id, "message", queue, None, subjects_of(update)
    )


ROWS = [
    # Alice writes privately; Bob replies to her in the group; a contact card names her; Bob
    # alone; Alice added to the group by Bob; the other bot's update from Alice stays.
    _update(1, {"chat": {"id": ALICE, "type": "private"}, "from": _person(ALICE)}),
    _update(
        2,
        {
            "chat": {"id": GROUP, "type": "group"},
            "from": _person(BOB),
            "reply_to_message": {"message_id": 9, "from": _person(ALICE)},
        },
    ),
    _update(3, {"chat": {"id": BOB, "type": "private"}, "contact": {"user_id": ALICE}}),
    _update(4, {"chat": {"id": BOB, "type": "private"}, "from": _person(BOB)}),
    _update(
        5,
        {
            "chat": {"id": GROUP, "type": "group"},
            "from": _person(BOB),
            "new_chat_members": [_person(ALICE)],
        },
    ),
]


def _now() -> int:
    return 1_000


@_rule("an erasure takes every update naming its subject, its history and events", "durable")
async def _erase_user(store: OperatorStore, f: _Findings) -> None:
    await store.add_many(ROWS)
    other = ROWS[0]
    await store.add_many([NewUpdate(OTHER_BOT, 1, other.body, 1, subjects=other.subjects)])
    # Update 4 (Bob's) has an attempt behind it; update 1 (Alice's) is held right now.
    held = await store.claim_next_owned(
        now=10, lease_until=10_000, max_attempts=MAX, limit=10, ordering="none"
    )
    by_id = {c.identity.update_id: c.identity for c in held if c.identity.bot == BOT}
    f.equal(sorted(by_id), [1, 2, 3, 4, 5], "the claim before the erasure")
    if 4 in by_id:
        await store.settle_owned(by_id[4], Completed(20))
    dry = await store.request_erasure(
        BOT, kind="user", subject=ALICE, at=30, by=ERASER, dry_run=True
    )
    await store.work_on_erasures(_now, lease_ms=5_000)
    counted = await store.get_erasure(dry)
    f.equal(
        None if counted is None else (counted.state, counted.updates, counted.attempts),
        ("done", 4, 4),
        "the dry run's counts (state, updates, attempts)",
    )
    f.expect(await store.get_update(BOT, 1) is not None, "a dry run erased nothing")

    job = await store.request_erasure(BOT, kind="user", subject=ALICE, at=40, by=ERASER)
    finished = await store.work_on_erasures(_now, lease_ms=5_000)
    f.equal([done.id for done in finished], [job], "the job finished by the worker")
    left = [u for u in range(1, 6) if await store.get_update(BOT, u) is not None]
    f.equal(left, [4], "updates left of the bot: Bob's own only")
    f.expect(await store.get_update(OTHER_BOT, 1) is not None, "another bot's update stays")
    f.equal(await store.attempt_history(BOT, 1), None, "the erased update's history")
    f.equal(len(await store.attempt_history(BOT, 4) or []), 1, "the kept update's history")
    if 1 in by_id:
        f.equal(await store.owns(by_id[1], 50), False, "owns of an attempt whose update went")
        f.equal(
            await store.settle_owned(by_id[1], Failed(50, 60, "late")),
            False,
            "a settle of an attempt whose update went",
        )
    shown = await store.get_erasure(job)
    f.equal(
        None if shown is None else (shown.state, shown.updates, shown.dry_run),
        ("done", 4, False),
        "the job as it stands",
    )
    audit = await store.audit_log(limit=5)
    f.expect(
        any(entry.action == "erase" and entry.changed == 4 for entry in audit),
        f"an audit entry with the counts: {audit}",
    )
    f.expect(all(str(ALICE) not in (entry.detail or "") for entry in audit), "no id in the audit")


@_rule("a bot's erasure takes everything it stored, and no other bot's", "durable")
async def _erase_bot(store: OperatorStore, f: _Findings) -> None:
    await store.add_many(ROWS)
    await store.add_many([NewUpdate(OTHER_BOT, 1, ROWS[0].body, 1)])
    await store.request_erasure(BOT, kind="bot", subject=None, at=30, by=ERASER)
    await store.work_on_erasures(_now, lease_ms=5_000)
    left = [u for u in range(1, 6) if await store.get_update(BOT, u) is not None]
    f.equal(left, [], "the bot's updates left")
    f.expect(await store.get_update(OTHER_BOT, 1) is not None, "another bot's update stays")


@_rule("an erasure whose worker died goes on once its lease lapses", "durable")
async def _erasure_taken_over(store: OperatorStore, f: _Findings) -> None:
    await store.add_many(ROWS)
    job = await store.request_erasure(BOT, kind="chat", subject=GROUP, at=30, by=ERASER)
    reads = iter([1_000, 1_000])

    def dies() -> int:  # the worker's clock answers twice (the take), then the process dies
        return next(reads)

    with contextlib.suppress(RuntimeError):  # StopIteration, as a coroutine raises it
        await store.work_on_erasures(dies, lease_ms=5_000)
    f.equal(await store.work_on_erasures(_now, lease_ms=5_000), [], "a job still leased")
    f.expect(await store.get_update(BOT, 2) is not None, "nothing erased by the dead worker")
    await store.work_on_erasures(lambda: 6_001, lease_ms=5_000)
    shown = await store.get_erasure(job)
    f.equal(None if shown is None else shown.state, "done", "the job taken over")
    left = [u for u in range(1, 6) if await store.get_update(BOT, u) is not None]
    f.equal(left, [1, 3, 4], "updates left after the group's erasure")


@_rule("retention erases delivered bodies and keeps every row and open exhaustion", "durable")
async def _retention(store: OperatorStore, f: _Findings) -> None:
    await store.add_many(ROWS)
    held = await store.claim_next_owned(
        now=10, lease_until=10_000, max_attempts=MAX, limit=10, ordering="none"
    )
    by_id = {c.identity.update_id: c.identity for c in held}
    if len(by_id) != 5:
        f.equal(sorted(by_id), [1, 2, 3, 4, 5], "the claim")
        return
    await store.settle_owned(by_id[1], Completed(20))  # delivered
    await store.settle_owned(by_id[2], Failed(20, 10**9, "HTTP 500: busy"))  # to retry
    await store.exhaust(by_id[3], 20, "HTTP 400: refused")  # open exhaustion
    await store.exhaust(by_id[4], 20, "HTTP 400: refused")
    await store.acknowledge_exhaustion(by_id[4], 25)  # acknowledged
    await store.settle_owned(by_id[5], Completed(40))  # delivered later
    erased = await store.erase_delivered_bodies(BOT, settled_before=30, at=50)
    f.equal(erased, 2, "bodies erased: the delivered and the acknowledged, settled by 30")
    rows = {u: await store.get_update(BOT, u) for u in range(1, 6)}
    bodies = {u: None if row is None else row.body for u, row in rows.items()}
    f.equal({u: body is None for u, body in bodies.items()}, {
        1: True, 2: False, 3: False, 4: True, 5: False,
    }, "whose body is gone")  # fmt: skip
    first = rows[1]
    f.equal(
        None if first is None else (first.state, first.update_type, first.erased_at),
        ("completed", "message", 50),
        "an erased row keeps its state and type, and says when",
    )
    f.equal(
        [a.error for a in await store.attempt_history(BOT, 4) or []],
        [None],
        "the erased update's attempt errors",
    )
    f.equal(await store.add_many([ROWS[0]]), set(), "a re-post of an erased update")
    f.equal(await store.erase_delivered_bodies(BOT, settled_before=30, at=60), 0, "erased once")


@_rule("search by user finds every update naming them in any role", "durable")
async def _search_by_user(store: OperatorStore, f: _Findings) -> None:
    await store.add_many(ROWS)
    for subject, expected in ((ALICE, [5, 3, 2, 1]), (BOB, [5, 4, 3, 2]), (GROUP, [5, 2])):
        page = await store.search_updates(UpdateFilter(bots=(BOT,), user=str(subject)), limit=10)
        f.equal([row.update_id for row in page.items], expected, f"the updates naming {subject}")
    nobody = await store.search_updates(UpdateFilter(bots=(BOT,), user="4242"), limit=10)
    f.equal(nobody.items, [], "an id no update names")
