"""Erasure in the console: the dry run's counts first, then the erasure confirmed with them, the
id only ever in a POSTed form, and a viewer who sees the page and cannot act."""

from __future__ import annotations

import json
import re

from app.store import NewUpdate
from tests.api.conftest import OPERATOR_KEY, VIEWER_KEY, now_ms
from tests.console.conftest import Console

ALICE, BOB = 5_101, 5_202


def update(update_id: int, user: int) -> str:
    person = {"id": user, "is_bot": False, "first_name": "someone"}
    chat = {"id": user, "type": "private"}
    return json.dumps({"update_id": update_id, "message": {"chat": chat, "from": person}})


async def test_an_operator_counts_then_erases_and_a_viewer_cannot(console: Console) -> None:
    store = console.api.store
    for update_id, user in ((1, ALICE), (2, ALICE), (3, BOB)):
        body = update(update_id, user)
        subjects = (user,)
        await store.add_many([NewUpdate("shop", update_id, body, now_ms(), subjects=subjects)])
    assert (await console.sign_in(OPERATOR_KEY)).status_code == 303
    page = await console.get("/console/erasures")
    assert page.status_code == 200
    assert 'label for="e-subject"' in page.text

    counted = await console.act(
        "/console/erasures/count", bot="shop", kind="user", subject=str(ALICE)
    )
    assert counted.status_code == 200, counted.text
    assert "Would erase <strong>2</strong> updates" in counted.text
    assert await store.get_update("shop", 1) is not None  # a dry run erases nothing

    refused = await console.act("/console/erasures/count", bot="shop", kind="user", subject="x")
    assert refused.status_code == 400
    assert "not a Telegram id" in refused.text

    done = await console.act("/console/erasures", bot="shop", kind="user", subject=str(ALICE))
    assert done.status_code == 303
    location = done.headers["location"]
    assert re.fullmatch(r"/console/erasures/[0-9]+", location), location  # no id in a URL
    for _ in range(100):
        shown = await console.get(location)
        if ": done" in shown.text:
            break
        await store.work_on_erasures(lambda: now_ms(), lease_ms=30_000)
    assert "Erased <strong>2</strong> updates" in shown.text
    assert str(ALICE) not in shown.text
    assert [await store.get_update("shop", n) is None for n in (1, 2, 3)] == [True, True, False]

    viewer = Console(console.api, console.http)
    assert (await viewer.sign_in(VIEWER_KEY)).status_code == 303
    seen = await viewer.get("/console/erasures")
    assert "can only see" in seen.text
    acted = await viewer.act("/console/erasures", bot="shop", kind="user", subject=str(BOB))
    assert acted.status_code == 403
    assert await store.get_update("shop", 3) is not None
