"""The callback routes, `/v1/claims/owns|renew|settle`, on each backend: every answer is the
store's fenced transition for the exact identity, at the database clock's now. Checks that
end before the store is asked (a bot not configured or in plain mode, a request's shape) run
on SQLite alone.

Starting a server costs more than the checks it serves, so a test runs its cases in a loop
over one served app; each assertion names its case."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from typing import Any

from app.store import ClaimIdentity
from tests.api.conftest import (
    LEASE_SECONDS,
    RETRY_AFTER_CAP_SECONDS,
    RETRY_BASE_SECONDS,
    Api,
    between,
    now_ms,
    update_body,
    wire,
)

# One field of the identity wrong; `news` is configured and durable, like `shop`.
WRONG: dict[str, Callable[[ClaimIdentity], ClaimIdentity]] = {
    "bot": lambda i: dataclasses.replace(i, bot="news"),
    "update_id": lambda i: dataclasses.replace(i, update_id=i.update_id + 1),
    "attempt": lambda i: dataclasses.replace(i, attempt=i.attempt + 1),
    "claim_id": lambda i: dataclasses.replace(i, claim_id=str(uuid.uuid4())),
}


def malformed(identity: ClaimIdentity, field: str, value: Any) -> dict[str, Any]:
    """The live identity, settling it, with `field` set to `value` (`...`: left out)."""
    body = wire(identity, outcome="completed")
    if value is ...:
        del body[field]
    else:
        body[field] = value
    return body


# Each would settle the live claim if the API coerced or ignored what is wrong.
MALFORMED: list[tuple[str, Any]] = [
    ("claim_id", ...),
    ("update_id", -1),
    ("update_id", "1"),
    ("update_id", 1.5),
    ("update_id", 1.0),  # an integer is written as one, as the webhook's update_id (issue 20)
    ("attempt", 1.0),
    ("attempt", 0),
    ("attempt", True),
    ("attempt", "1"),
    ("bot", "Shop"),
    ("bot", "shop/1"),
    ("claim_id", "x" * 65),
    ("claim_id", ""),
    ("outcome", "done"),
    ("lease_hint", 30_000),  # no such field
]


async def test_a_malformed_identity_is_422_naming_the_field_and_changes_nothing(
    api: Api,
) -> None:
    identity = await api.claim()
    before = await api.row()
    for field, value in MALFORMED:
        case = (field, value)
        response = await api.post("/v1/claims/settle", malformed(identity, field, value))
        assert response.status_code == 422, case
        assert f"body.{field}" in response.json()["error"], case
        assert await api.row() == before, case
    # The well-formed identity settles: the 422s were about the malformed fields alone.
    settled = await api.post("/v1/claims/settle", wire(identity, outcome="completed"))
    assert settled.json() == {"settled": True}


async def test_a_nul_character_is_422_not_a_database_outage(api: Api) -> None:
    """PostgreSQL text cannot hold NUL: the driver's refusal used to come back as a 503 with
    Retry-After, which tells the downstream to send the same request again."""
    identity = await api.claim()
    before = await api.row()
    for field in ("claim_id", "error"):
        body = wire(identity, outcome="failed", error="broken")
        body[field] += "\x00"
        response = await api.post("/v1/claims/settle", body)
        assert response.status_code == 422, field
        assert f"body.{field}" in response.json()["error"], field
        assert await api.row() == before, field
    acknowledge = await api.post("/v1/exhaustions/acknowledge", wire(identity, claim_id="c\x00"))
    assert acknowledge.status_code == 422
    assert "body.claim_id" in acknowledge.json()["error"]


async def test_settle_refuses_retry_after_ms_unless_failed(sqlite_api: Api) -> None:
    identity = await sqlite_api.claim()
    before = await sqlite_api.row()
    for outcome in ("completed", "exhausted"):
        body = wire(identity, outcome=outcome, retry_after_ms=1_000)
        response = await sqlite_api.post("/v1/claims/settle", body)
        assert response.status_code == 422, outcome
        assert "retry_after_ms is for outcome 'failed' only" in response.json()["error"]
        assert await sqlite_api.row() == before, outcome


async def test_settle_refuses_an_error_with_outcome_completed(sqlite_api: Api) -> None:
    identity = await sqlite_api.claim()
    body = wire(identity, outcome="completed", error="x")
    response = await sqlite_api.post("/v1/claims/settle", body)
    assert response.status_code == 422
    assert "error is for outcomes 'failed' and 'exhausted' only" in response.json()["error"]
    assert (await sqlite_api.row()).state == "processing"


def requests(identity: ClaimIdentity) -> list[tuple[str, dict[str, Any]]]:
    """The three claim routes, each with a request for `identity`."""
    return [
        ("/v1/claims/owns", wire(identity)),
        ("/v1/claims/renew", wire(identity)),
        ("/v1/claims/settle", wire(identity, outcome="completed")),
    ]


async def test_a_bot_that_is_not_configured_is_404(sqlite_api: Api) -> None:
    for path, body in requests(ClaimIdentity("ghost", 1, 1, str(uuid.uuid4()))):
        response = await sqlite_api.post(path, body)
        assert response.status_code == 404, path
        assert response.json() == {"error": "no bot 'ghost' is configured"}


async def test_a_destination_the_bot_lacks_is_404_and_default_is_what_none_means(
    api: Api,
) -> None:
    identity = await api.claim(lease_ms=30_000)
    for path, body in requests(identity):
        response = await api.post(path, body | {"destination": "payments"})
        assert response.status_code == 404, path
        assert response.json() == {"error": "bot 'shop' has no destination 'payments'"}
        malformed_name = await api.post(path, body | {"destination": "Payments"})
        assert malformed_name.status_code == 422, path
    # Nothing changed: the claim is live, and `default` named or left out is the same one.
    for body in (wire(identity), wire(identity) | {"destination": "default"}):
        response = await api.post("/v1/claims/owns", body)
        assert response.json() == {"owned": True, "lease_expires_at": (await api.row()).due_at}


async def test_a_plain_mode_bot_is_409(sqlite_api: Api) -> None:
    for path, body in requests(ClaimIdentity("legacy", 1, 1, str(uuid.uuid4()))):
        response = await sqlite_api.post(path, body)
        assert response.status_code == 409, path
        assert response.json() == {
            "error": "bot 'legacy' is in plain mode: its attempts carry no identity"
        }


# -- owns --------------------------------------------------------------------------------------


async def test_owns_a_live_claim_answers_true_with_its_lease_end(api: Api) -> None:
    identity = await api.claim(lease_ms=30_000)
    response = await api.post("/v1/claims/owns", wire(identity))
    assert response.status_code == 200
    assert response.json() == {"owned": True, "lease_expires_at": (await api.row()).due_at}


async def test_owns_is_false_when_one_field_of_the_identity_is_wrong(api: Api) -> None:
    identity = await api.claim()
    await api.claim("news", 1)  # the other bot holds the same update_id
    for field, wrong in WRONG.items():
        response = await api.post("/v1/claims/owns", wire(wrong(identity)))
        assert response.status_code == 200, field
        assert response.json() == {"owned": False, "lease_expires_at": None}, field


async def test_owns_is_false_once_the_lease_lapsed(api: Api) -> None:
    identity = await api.lapsed_claim()
    response = await api.post("/v1/claims/owns", wire(identity))
    assert response.json() == {"owned": False, "lease_expires_at": None}
    assert (await api.row()).state == "processing"  # lapsed, not yet reclaimed


async def test_after_a_reclaim_only_the_new_identity_owns(api: Api) -> None:
    old = await api.lapsed_claim()
    new = await api.claim()  # a rival worker, later
    assert (new.attempt, old.attempt) == (2, 1)
    old_answer = await api.post("/v1/claims/owns", wire(old))
    new_answer = await api.post("/v1/claims/owns", wire(new))
    assert old_answer.json() == {"owned": False, "lease_expires_at": None}
    assert new_answer.json() == {"owned": True, "lease_expires_at": (await api.row()).due_at}
    # The old claim_id with the new attempt number is no identity either.
    mixed = dataclasses.replace(new, claim_id=old.claim_id)
    assert (await api.post("/v1/claims/owns", wire(mixed))).json()["owned"] is False


# -- renew -------------------------------------------------------------------------------------


async def test_renew_extends_a_live_lease_by_lease_ms_from_now(api: Api) -> None:
    identity = await api.claim(lease_ms=2_000)
    before = now_ms()
    response = await api.post("/v1/claims/renew", wire(identity, lease_ms=45_000))
    after = now_ms()
    answer = response.json()
    assert answer["renewed"] is True
    assert between(answer["lease_expires_at"], before + 45_000, after + 45_000)
    assert (await api.row()).due_at == answer["lease_expires_at"]
    assert (await api.post("/v1/claims/owns", wire(identity))).json() == {
        "owned": True,
        "lease_expires_at": answer["lease_expires_at"],
    }


async def test_renew_defaults_to_the_bots_lease_seconds(api: Api) -> None:
    identity = await api.claim(lease_ms=2_000)
    before = now_ms()
    answer = (await api.post("/v1/claims/renew", wire(identity))).json()
    after = now_ms()
    lease_ms = LEASE_SECONDS * 1000
    assert answer["renewed"] is True
    assert between(answer["lease_expires_at"], before + lease_ms, after + lease_ms)
    assert (await api.row()).due_at == answer["lease_expires_at"]


async def test_renew_never_shortens_a_lease(api: Api) -> None:
    identity = await api.claim(lease_ms=600_000)
    lease_end = (await api.row()).due_at
    response = await api.post("/v1/claims/renew", wire(identity, lease_ms=1_000))
    assert response.json() == {"renewed": True, "lease_expires_at": lease_end}
    assert (await api.row()).due_at == lease_end


async def test_renew_does_not_revive_a_lapsed_lease(api: Api) -> None:
    identity = await api.lapsed_claim()
    before = await api.row()
    response = await api.post("/v1/claims/renew", wire(identity, lease_ms=60_000))
    assert response.json() == {"renewed": False, "lease_expires_at": None}
    assert await api.row() == before
    assert (await api.post("/v1/claims/owns", wire(identity))).json()["owned"] is False


async def test_renew_with_one_field_wrong_changes_nothing(api: Api) -> None:
    identity = await api.claim(lease_ms=2_000)
    await api.claim("news", 1, lease_ms=2_000)
    before, other = await api.row(), await api.row("news", 1)
    for field, wrong in WRONG.items():
        body = wire(wrong(identity), lease_ms=60_000)
        response = await api.post("/v1/claims/renew", body)
        assert response.json() == {"renewed": False, "lease_expires_at": None}, field
    assert await api.row() == before
    assert await api.row("news", 1) == other


async def test_renew_refuses_a_lease_ms_out_of_range(sqlite_api: Api) -> None:
    identity = await sqlite_api.claim(lease_ms=2_000)
    before = await sqlite_api.row()
    for lease_ms in (0, -1, 86_400_001, 1.5, True, "60000"):
        response = await sqlite_api.post("/v1/claims/renew", wire(identity, lease_ms=lease_ms))
        assert response.status_code == 422, lease_ms
        assert "body.lease_ms" in response.json()["error"], lease_ms
    assert await sqlite_api.row() == before


# -- settle ------------------------------------------------------------------------------------


async def test_settle_completed_completes_the_row(api: Api) -> None:
    identity = await api.claim()
    before = now_ms()
    response = await api.post("/v1/claims/settle", wire(identity, outcome="completed"))
    after = now_ms()
    assert response.json() == {"settled": True}
    row = await api.row()
    assert (row.state, row.attempts, row.error) == ("completed", 1, None)
    assert row.settled_at is not None
    assert between(row.settled_at, before, after)
    assert (await api.post("/v1/claims/owns", wire(identity))).json()["owned"] is False


async def test_settle_failed_with_retry_after_ms_is_due_then(api: Api) -> None:
    identity = await api.claim()
    before = now_ms()
    response = await api.post(
        "/v1/claims/settle",
        wire(identity, outcome="failed", error="HTTP 503 upstream", retry_after_ms=7_000),
    )
    after = now_ms()
    assert response.json() == {"settled": True}
    row = await api.row()
    assert (row.state, row.error, row.settled_at) == ("failed", "HTTP 503 upstream", None)
    assert between(row.due_at, before + 7_000, after + 7_000)


async def test_settle_failed_caps_retry_after_ms_at_the_bots_cap(api: Api) -> None:
    identity = await api.claim()
    before = now_ms()
    response = await api.post(
        "/v1/claims/settle", wire(identity, outcome="failed", retry_after_ms=3_600_000)
    )
    after = now_ms()
    assert response.json() == {"settled": True}
    row = await api.row()
    cap = RETRY_AFTER_CAP_SECONDS * 1000
    assert (row.state, row.error) == ("failed", "failed by the downstream")
    assert between(row.due_at, before + cap, after + cap)


async def test_settle_failed_without_retry_after_ms_backs_off_within_the_bots_backoff(
    api: Api,
) -> None:
    identity = await api.claim()
    before = now_ms()
    response = await api.post("/v1/claims/settle", wire(identity, outcome="failed", error="e"))
    after = now_ms()
    assert response.json() == {"settled": True}
    row = await api.row()
    assert row.state == "failed"
    # Attempt 1: full jitter in [0, retry_base_seconds].
    assert between(row.due_at, before, after + RETRY_BASE_SECONDS * 1000)


async def test_settle_exhausted_on_a_durable_bot_keeps_an_exhaustion(api: Api) -> None:
    identity = await api.claim()
    response = await api.post(
        "/v1/claims/settle", wire(identity, outcome="exhausted", error="HTTP 400: no such chat")
    )
    assert response.json() == {"settled": True}
    row = await api.row()
    assert (row.state, row.error, row.settled_at) == ("abandoned", "HTTP 400: no such chat", None)
    assert row.exhausted_at is not None
    listed = (await api.get("/v1/exhaustions")).json()
    assert listed["items"] == [
        {
            **wire(identity),
            "destination": "default",  # every item names its destination
            "error": "HTTP 400: no such chat",
            "exhausted_at": row.exhausted_at,
            "update": update_body(1),
        }
    ]


async def test_settle_exhausted_on_a_fenced_bot_abandons_without_an_exhaustion(
    api: Api,
) -> None:
    identity = await api.claim("ledger", 1)
    response = await api.post("/v1/claims/settle", wire(identity, outcome="exhausted"))
    assert response.json() == {"settled": True}
    row = await api.row("ledger", 1)
    assert (row.state, row.error) == ("abandoned", "exhausted by the downstream")
    assert row.settled_at is not None  # prunable: nobody waits for an acknowledgement
    assert (row.exhausted_at, row.acknowledged_at) == (None, None)
    assert (await api.get("/v1/exhaustions")).json() == {"items": [], "next": None}


SETTLEMENTS: list[dict[str, Any]] = [
    {"outcome": "completed"},
    {"outcome": "failed", "retry_after_ms": 0},
    {"outcome": "exhausted", "error": "gave up"},
]


async def test_settle_with_one_field_wrong_changes_nothing(api: Api) -> None:
    identity = await api.claim()
    await api.claim("news", 1)  # a live claim on the other bot, with its own claim_id
    before, other = await api.row(), await api.row("news", 1)
    for settlement in SETTLEMENTS:
        for field, wrong in WRONG.items():
            case = (settlement["outcome"], field)
            response = await api.post("/v1/claims/settle", wire(wrong(identity), **settlement))
            assert response.json() == {"settled": False}, case
            assert await api.row() == before, case
            assert await api.row("news", 1) == other, case


async def test_settle_twice_settles_once(api: Api) -> None:
    for update_id, settlement in enumerate(SETTLEMENTS, start=1):
        identity = await api.claim("shop", update_id)
        first = await api.post("/v1/claims/settle", wire(identity, **settlement))
        settled = await api.row("shop", update_id)
        again = await api.post("/v1/claims/settle", wire(identity, **settlement))
        case = settlement["outcome"]
        assert (first.json(), again.json()) == ({"settled": True}, {"settled": False}), case
        assert await api.row("shop", update_id) == settled, case


async def test_settle_after_the_lease_lapsed_changes_nothing(api: Api) -> None:
    identity = await api.lapsed_claim()
    before = await api.row()
    response = await api.post("/v1/claims/settle", wire(identity, outcome="completed"))
    assert response.json() == {"settled": False}
    assert await api.row() == before
