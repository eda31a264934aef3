"""What a process counts for the console's charts and flushes into the minute samples
(`app/samples.py`, docs/design.md decision 8): by minute, receipt-to-delivery in its bucket,
kept across a failed flush, and from a running service with traffic, flushed as it stops."""

from __future__ import annotations

import pytest
from starlette.requests import Request
from starlette.responses import Response

from app.samples import MINUTE_MS, Tally, flush
from app.store import StoreUnavailable, open_store
from app.store.operator_types import MinuteCounts
from tests.api.conftest import API_KEYS
from tests.conftest import Storage
from tests.downstream import (
    FakeDownstream,
    Received,
    bot,
    eventually,
    message,
    now_ms,
    settings_for,
)
from tests.test_metrics import serving

T = 1_796_000_040_000  # a whole minute


def test_a_tally_counts_by_minute_and_puts_each_delivery_in_its_bucket() -> None:
    tally = Tally()
    tally.received("shop", ["default", "analytics"], T + 59_999)
    tally.received("shop", ["default"], T + MINUTE_MS)
    for since in (10, 11, 3_600_000, 3_600_001):
        tally.delivered("shop", "default", T, since)
    taken = {(c.destination, c.minute): c.counts for c in tally.take()}
    assert taken == {
        ("default", T): {
            "received": 1,
            "delivered": 4,
            "within_10": 1,
            "within_25": 1,
            "within_3600000": 1,
            "over": 1,
        },
        ("analytics", T): {"received": 1},
        ("default", T + MINUTE_MS): {"received": 1},
    }
    assert tally.take() == []  # taken once


async def test_a_flush_that_fails_keeps_its_counts_for_the_next() -> None:
    class Down:
        async def add_samples(self, counts: object) -> None:
            raise StoreUnavailable("connection refused")

    tally = Tally()
    tally.count("shop", "default", T, "received")
    with pytest.raises(StoreUnavailable):
        await flush(Down(), tally)  # type: ignore[arg-type]
    tally.count("shop", "default", T, "received")
    assert tally.take() == [MinuteCounts("shop", "default", T, {"received": 2})]


async def test_a_service_counts_what_it_does_and_flushes_as_it_stops(
    storage: Storage, downstream: FakeDownstream
) -> None:
    answers = {1: 200, 2: 503, 3: 400}  # delivered; retried, then delivered; exhausted

    async def answer(received: Received, _request: Request) -> Response:
        status = answers[received.update_id] if received.attempt == 1 else 200
        return Response("{}", status, media_type="application/json")

    downstream.answer = answer
    url = storage.url()
    settings = settings_for(url, bot(downstream, mode="durable"), api_keys=API_KEYS)
    began = now_ms()
    async with serving(settings, workers=True) as service:
        for update_id in answers:
            assert (await service.post("shop", message(update_id))).status_code == 200

        async def settled() -> bool:
            text = (await service.get_metrics()).text
            return 'outcome="terminal"} 1.0' in text and 'outcome="completed"} 2.0' in text

        await eventually(settled)
    store = await open_store(url)
    try:
        found = await store.samples(["shop"], since=began - began % MINUTE_MS, until=now_ms() + 1)
    finally:
        await store.close()
    totals: dict[str, int] = {}
    for sample in found:
        assert sample.destination == "default"
        for name, count in sample.counts.items():
            totals[name] = totals.get(name, 0) + count
    counted = {name: count for name, count in totals.items() if count}
    delivered_within = sum(c for name, c in counted.items() if name.startswith("within_"))
    assert delivered_within == 2
    assert {n: c for n, c in counted.items() if not n.startswith("within_")} == {
        "received": 3,
        "delivered": 2,
        "retried": 1,
        "exhausted": 1,
        "answered_2xx": 2,
        "answered_4xx": 1,
        "answered_5xx": 1,
    }


async def test_an_intake_without_workers_flushes_what_it_received(
    sqlite_storage: Storage, downstream: FakeDownstream
) -> None:
    url = sqlite_storage.url()
    settings = settings_for(url, bot(downstream, mode="durable"), api_keys=API_KEYS)
    began = now_ms()
    async with serving(settings) as service:  # `serve`: the intake alone
        for update_id in (1, 2, 2):  # a duplicate is not received twice
            assert (await service.post("shop", message(update_id))).status_code == 200
    store = await open_store(url)
    try:
        found = await store.samples(["shop"], since=began - began % MINUTE_MS, until=now_ms() + 1)
    finally:
        await store.close()
    assert sum(sample.counts["received"] for sample in found) == 2
    assert sum(sample.counts["delivered"] for sample in found) == 0
