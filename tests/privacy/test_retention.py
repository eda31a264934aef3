"""Kept no longer than needed: a bot's body_retention, as the workers apply it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.config import Settings, describe
from tests.conftest import Storage
from tests.downstream import (
    FakeDownstream,
    bot,
    dispatching,
    eventually,
    message,
    now_ms,
    settings_for,
    status,
)


async def test_until_delivered_erases_a_body_once_delivered_and_keeps_an_exhaustions(
    storage: Storage, downstream: FakeDownstream
) -> None:
    url = storage.url()

    async def answer(received, request):  # type: ignore[no-untyped-def]
        refused = status(400)
        return await (refused if received.update_id == 2 else status(200))(received, request)

    downstream.answer = answer
    settings = settings_for(url, bot(downstream, body_retention="until_delivered"))
    async with dispatching(settings) as (_, store):
        await store.add("shop", 1, message(1, chat=1, text="Wombat-marker"), now_ms())
        await store.add("shop", 2, message(2, chat=2, text="Wombat-marker"), now_ms())

        async def erased() -> bool:
            row = await store.get_update("shop", 1)
            return row is not None and row.erased_at is not None

        await eventually(erased)
        delivered, exhausted = await store.get_update("shop", 1), await store.get_update("shop", 2)
    assert delivered is not None
    assert (delivered.state, delivered.body) == ("completed", None)
    assert exhausted is not None
    assert exhausted.state == "abandoned"
    assert exhausted.body is not None
    assert "Wombat-marker" in exhausted.body  # an open exhaustion keeps its body


def test_body_retention_takes_until_delivered_or_days_and_refuses_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("INTAKE_SECRET_TOKEN", "s")
    for given, expected in (("until_delivered", "until_delivered"), ("7", 7)):
        monkeypatch.setenv("INTAKE_BODY_RETENTION", given)
        (default,) = Settings().bots
        assert default.body_retention == expected
    monkeypatch.setenv("INTAKE_BODY_RETENTION", "forever")
    with pytest.raises(ValidationError) as raised:
        Settings()
    assert "body_retention" in describe(raised.value)
