"""The downstream kit's `IntakeClient` against the real served app, on each backend: the answers
are the service's, parsed into the wire models; a refusal raises `CallbackError` (refusals do
not depend on the database: SQLite)."""

from __future__ import annotations

import dataclasses

import pytest

from app.store import ClaimIdentity
from telegram_intake_kit import CallbackError, Identity, IntakeClient, Owned, Renewed, Settled
from telegram_intake_kit.wire import Acknowledged
from tests.api.conftest import (
    KEY,
    LEASE_SECONDS,
    OPERATIONS_KEY,
    Api,
    between,
    now_ms,
)


def kit(identity: ClaimIdentity) -> Identity:
    return Identity(**dataclasses.asdict(identity))


async def test_the_client_owns_renews_and_settles_a_live_claim(api: Api) -> None:
    identity = kit(await api.claim(lease_ms=2_000))
    async with IntakeClient(api.base, KEY) as client:
        assert await client.owns(identity) == Owned(
            owned=True, lease_expires_at=(await api.row()).due_at
        )
        before = now_ms()
        renewed = await client.renew(identity, lease_ms=90_000)
        assert renewed.renewed is True
        assert renewed.lease_expires_at is not None
        assert between(renewed.lease_expires_at, before + 90_000, now_ms() + 90_000)
        # Without lease_ms (left out of the request), the bot's lease_seconds.
        before = now_ms()
        default = await client.renew(identity)
        assert default.lease_expires_at is not None
        lease_ms = LEASE_SECONDS * 1000
        assert between(default.lease_expires_at, before + lease_ms, now_ms() + lease_ms)
        assert default.lease_expires_at == (await api.row()).due_at
        assert await client.settle(identity, "completed") == Settled(settled=True)
        assert await client.settle(identity, "completed") == Settled(settled=False)
        assert await client.owns(identity) == Owned(owned=False, lease_expires_at=None)
        assert await client.renew(identity) == Renewed(renewed=False, lease_expires_at=None)
    assert (await api.row()).state == "completed"


async def test_the_client_settles_failed_and_exhausted_and_acknowledges(api: Api) -> None:
    failing = kit(await api.claim("shop", 1))
    exhausted = kit(await api.claim("shop", 2))
    async with IntakeClient(api.base, KEY) as client:
        before = now_ms()
        settled = await client.settle(
            failing, "failed", error="HTTP 429 from the bot API", retry_after_ms=9_000
        )
        after = now_ms()
        assert settled == Settled(settled=True)
        assert await client.settle(exhausted, "exhausted", error="chat not found") == Settled(
            settled=True
        )
        failed_row, exhausted_row = await api.row("shop", 1), await api.row("shop", 2)
        assert (failed_row.state, failed_row.error) == ("failed", "HTTP 429 from the bot API")
        assert between(failed_row.due_at, before + 9_000, after + 9_000)
        assert (exhausted_row.state, exhausted_row.error) == ("abandoned", "chat not found")
        assert exhausted_row.exhausted_at is not None
        assert await client.acknowledge(exhausted) == Acknowledged(acknowledged=True)
        assert await client.acknowledge(exhausted) == Acknowledged(acknowledged=False)
    assert (await api.row("shop", 2)).acknowledged_at is not None


async def test_the_client_raises_401_with_the_services_message(sqlite_api: Api) -> None:
    identity = kit(await sqlite_api.claim())
    async with IntakeClient(sqlite_api.base, "not-a-configured-key-0123") as client:
        with pytest.raises(CallbackError) as refused:
            await client.owns(identity)
        assert refused.value.status == 401
        assert refused.value.message == "a valid API key is required: Authorization: Bearer <key>"
        with pytest.raises(CallbackError) as refused:
            await client.settle(identity, "completed")
        assert refused.value.status == 401
    assert (await sqlite_api.row()).state == "processing"


async def test_the_client_raises_422_for_what_the_service_refuses(sqlite_api: Api) -> None:
    identity = await sqlite_api.claim()
    # Built without validation, as a client of another version of the wire models might send.
    unchecked = Identity.model_construct(
        bot="Shop", update_id=identity.update_id, attempt=0, claim_id=identity.claim_id
    )
    async with IntakeClient(sqlite_api.base, KEY) as client:
        for call in (client.owns, client.acknowledge):
            with pytest.raises(CallbackError) as refused:
                await call(unchecked)
            assert refused.value.status == 422
            assert "body.bot" in refused.value.message
            assert "body.attempt" in refused.value.message
            assert str(refused.value).startswith("422: ")
    assert (await sqlite_api.row()).state == "processing"


async def test_the_client_raises_403_404_and_409_with_the_services_message(sqlite_api: Api) -> None:
    identity = kit(await sqlite_api.claim())
    async with IntakeClient(sqlite_api.base, OPERATIONS_KEY) as operations:
        with pytest.raises(CallbackError) as refused:
            await operations.renew(identity)
        assert (refused.value.status, refused.value.message) == (
            403,
            "this API key lacks the callback scope",
        )
    async with IntakeClient(sqlite_api.base, KEY) as client:
        with pytest.raises(CallbackError) as refused:
            await client.settle(identity.model_copy(update={"bot": "ghost"}), "completed")
        assert (refused.value.status, refused.value.message) == (
            404,
            "no bot 'ghost' is configured",
        )
        with pytest.raises(CallbackError) as refused:
            await client.owns(identity.model_copy(update={"bot": "legacy"}))
        assert refused.value.status == 409
        assert "plain mode" in refused.value.message
    assert (await sqlite_api.row()).state == "processing"
