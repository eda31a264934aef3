"""The console per destination (docs/destinations.md): each destination's controls and a replay
on the bots page, the search and the exhaustions seen from one destination, on both backends.
The bot `shop` has `payments` and `analytics` beside `default`
(`tests/api/test_destination_keys`)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from tests.api.conftest import KEY
from tests.api.test_destination_keys import SECRET, Seeded, seeded
from tests.console.conftest import Console

__all__ = ["seeded"]  # the fixture, shared with the API's tests


@pytest.fixture
async def signed(seeded: Seeded) -> AsyncIterator[tuple[Console, Seeded]]:
    async with httpx.AsyncClient(base_url=seeded.api.base, timeout=30) as client:
        console = Console(seeded.api, client)
        assert (await console.sign_in(KEY)).status_code == 303
        yield console, seeded


async def test_each_destination_is_paused_limited_and_resumed_from_the_bots_page(
    signed: tuple[Console, Seeded],
) -> None:
    console, seeded = signed
    store = seeded.api.store
    page = (await console.get("/console/bots")).text
    assert "shop to payments" in page
    assert "shop to analytics" in page
    paused = await console.act(
        "/console/bots/shop/pause", destination="payments", reason="refunds frozen"
    )
    assert paused.status_code == 303
    await console.act("/console/bots/shop/rate-limit", destination="analytics", per_second="2")
    controls = {c.destination: c for c in await store.bot_controls(["shop"], destinations=True)}
    assert (controls["payments"].paused_reason, controls["payments"].rate_per_second) == (
        "refunds frozen", None)  # fmt: skip
    assert (controls["analytics"].paused, controls["analytics"].rate_per_second) == (False, 2.0)
    (bot,) = await store.bot_controls(["shop"])
    assert not bot.paused  # the bot's own pause: untouched
    page = (await console.get("/console/bots")).text
    assert "Resume shop to payments" in page
    assert "(refunds frozen)" in page
    await console.act("/console/bots/shop/resume", destination="payments")
    assert not (await store.bot_controls(["shop"], destinations=True))[1].paused
    missing = await console.act("/console/bots/shop/pause", destination="refunds")
    assert missing.status_code == 404


async def test_a_replay_is_counted_first_then_done_from_the_bots_page(
    signed: tuple[Console, Seeded],
) -> None:
    console, seeded = signed
    form = {"destination": "payments", "first": "1", "last": "10"}
    dry = await console.act("/console/bots/shop/replay", **form, dry_run="yes")
    assert dry.status_code == 303
    told = (await console.get(dry.headers["location"])).text
    assert "A replay would deliver 1 updates (1 to 10) of shop to payments" in told
    view = await seeded.api.store.get_update("shop", 6)
    assert view is not None
    assert [d.destination for d in view.deliveries or ()] == ["analytics"]
    done = await console.act("/console/bots/shop/replay", **form)
    assert "Replayed 1 updates" in (await console.get(done.headers["location"])).text
    view = await seeded.api.store.get_update("shop", 6)
    assert view is not None
    assert [d.destination for d in view.deliveries or ()] == ["analytics", "payments"]
    backwards = await console.act("/console/bots/shop/replay", **form | {"first": "11"})
    assert backwards.status_code == 400


async def test_the_updates_and_exhaustions_are_seen_from_one_destination(
    signed: tuple[Console, Seeded],
) -> None:
    console, _ = signed
    rows = (await console.get("/console/updates", destination="analytics")).text
    assert "each as destination analytics sees it" in rows
    assert "<td>abandoned (exhaustion)</td>" in rows  # 5, exhausted there
    assert "<td>processing</td>" in rows  # 6, live there
    own = (await console.get("/console/updates", destination="default")).text
    assert "shop 5" in own
    assert "shop 6" not in own  # 6 never went to default
    assert (await console.get("/console/updates", destination="refunds")).status_code == 404
    none = (await console.get("/console/exhaustions")).text
    assert "<strong>0</strong> open exhaustions match" in none  # default's: none
    listed = (await console.get("/console/exhaustions", destination="analytics")).text
    assert "<strong>1</strong> open exhaustions match" in listed
    assert "shop 5</a> to analytics" in listed
    assert SECRET in listed
    preview = await console.get("/console/exhaustions", destination="analytics", preview="redrive")
    assert 'name="destination" value="analytics"' in preview.text
    done = await console.act("/console/exhaustions/redrive", destination="analytics", all="yes")
    assert "destination=analytics" in done.headers["location"]
    after = (await console.get(done.headers["location"])).text
    assert "Redrove 1 exhaustions" in after
