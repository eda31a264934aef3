"""Operator control over HTTP (docs/contract.md section 9) on each backend: the bots (pause,
resume, rate limit), search with its cursor, attempt history, park, redrive and acknowledgement in
bulk, the audit log; and the scopes: a viewer reads everything and acts on nothing, an operator
acts, and every action is recorded under the key's name, never the key.

Rows are set up and read back through the test's own store; checks that end before the store
is asked (a query's shape) run on SQLite alone. Starting a server costs more than the checks
it serves, so a test runs its cases in a loop over one served app; each assertion names its
case."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import httpx
import pytest

from app.store import ClaimIdentity, Completed, Failed, WebhookInfo
from app.store.views import methods as view_methods
from tests.api.conftest import (
    CALLBACK_KEY,
    KEY,
    OPERATIONS_KEY,
    OPERATOR_KEY,
    OPERATOR_NAME,
    SHOP_KEY,
    VIEWER_KEY,
    VIEWER_NAME,
    Api,
    between,
    now_ms,
    update_body,
    wire,
)
from tests.conftest import table_rows

# The name the audit log knows the unnamed full-access key by: a hash of it, never the key.
KEY_LABEL = "key-1"  # unnamed, first in API_KEYS, and no console secret
NO_SUCH_CLAIM = "00000000-0000-4000-8000-000000000000"


async def snapshot(api: Api) -> tuple[Any, ...]:
    """Everything an action could change: every row, the bots' controls, the audit log."""
    rows = table_rows(api.url, "*")
    # Ordered by key only: an update's attempts in a stable order of their own.
    history = sorted(table_rows(api.url, "*", table="telegram_updates_attempts"), key=repr)
    controls = await api.store.bot_controls(None)
    audit = await api.store.audit_log(limit=500)
    return rows, history, controls, audit


async def claim_all(api: Api, *, at: int | None = None, max_attempts: int = 8) -> list[Any]:
    """What a worker's claim takes now (every bot, chat order), by key."""
    now = now_ms() if at is None else at
    claimed = await api.store.claim_next_owned(
        now=now,
        lease_until=now + 60_000,
        max_attempts=max_attempts,
        limit=100,
        durable_exhaustion=True,
    )
    return [(c.identity.bot, c.identity.update_id) for c in claimed]


async def audit_items(api: Api, *, key: str = VIEWER_KEY) -> list[dict[str, Any]]:
    response = await api.get("/v1/audit", key=key, limit=500)
    assert response.status_code == 200, response.text
    items: list[dict[str, Any]] = response.json()["items"]
    return items


def error_of(response: httpx.Response) -> str:
    error: str = response.json()["error"]
    return error


# -- GET /v1/bots ------------------------------------------------------------------------------


async def test_bots_list_every_configured_bot_with_controls_counts_and_age(api: Api) -> None:
    now = now_ms()
    await api.add("shop", 1, received_at=now - 50_000)
    await api.add("shop", 2, received_at=now - 10_000)
    await api.exhaustion("shop", 3)
    await api.claim("news", 1, received_at=now - 20_000)
    done = await api.claim("ledger", 1, received_at=now - 900_000)
    assert await api.store.settle_owned(done, Completed(now_ms()))
    paused = await api.post("/v1/bots/shop/pause", {"reason": "downstream upgrade"})
    assert paused.status_code == 200, paused.text
    limited = await api.post("/v1/bots/news/rate-limit", {"per_second": 2.5}, key=OPERATOR_KEY)
    assert limited.status_code == 200, limited.text

    before = now_ms()
    response = await api.get("/v1/bots", key=VIEWER_KEY)
    after = now_ms()
    assert response.status_code == 200, response.text
    items = {item["bot"]: item for item in response.json()["items"]}
    # Every configured bot, in the configuration's order, rows or not.
    assert [item["bot"] for item in response.json()["items"]] == [
        "shop",
        "news",
        "ledger",
        "legacy",
    ]
    shop = items["shop"]
    assert shop["paused"] is True
    assert (shop["paused_by"], shop["paused_reason"]) == (KEY_LABEL, "downstream upgrade")
    assert between(shop["paused_at"], before - 10_000, after)
    assert shop["rate_limit_per_second"] is None
    assert shop["counts"] == {"pending": 2, "abandoned": 1}
    assert shop["open_exhaustions"] == 1
    assert 50_000 - 50 <= shop["oldest_undelivered_age_ms"] <= 50_000 + (after - now) + 50
    assert shop["breaker"] is None
    news = items["news"]
    assert (news["paused"], news["paused_at"], news["paused_by"]) == (False, None, None)
    assert news["rate_limit_per_second"] == 2.5
    assert news["counts"] == {"processing": 1}
    assert news["open_exhaustions"] == 0
    assert 20_000 - 50 <= news["oldest_undelivered_age_ms"] <= 20_000 + (after - now) + 50
    ledger = items["ledger"]
    assert ledger["counts"] == {"completed": 1}
    assert (ledger["open_exhaustions"], ledger["oldest_undelivered_age_ms"]) == (0, None)
    legacy = items["legacy"]
    assert legacy == {
        "bot": "legacy",
        "paused": False,
        "paused_at": None,
        "paused_by": None,
        "paused_reason": None,
        "rate_limit_per_second": None,
        "counts": {},
        "open_exhaustions": 0,
        "oldest_undelivered_age_ms": None,
        "breaker": None,
        "webhook": None,
    }


async def test_bots_show_what_the_webhook_watch_last_saw(api: Api) -> None:
    info = WebhookInfo("https://intake.example.com/telegram/shop", 12, 1_700_000_000, "HTTP 502")
    await api.store.report_webhook_info("shop", info, at=1_800_000_000_000)
    items = {item["bot"]: item for item in (await api.get("/v1/bots")).json()["items"]}
    assert items["shop"]["webhook"] == {
        "pending_update_count": 12,
        "last_error_date": 1_700_000_000,
        "last_error_message": "HTTP 502",
        "checked_at": 1_800_000_000_000,
    }
    assert items["news"]["webhook"] is None


async def test_bots_show_a_bots_limited_key_only_its_bots_and_the_breaker(api: Api) -> None:
    await api.add("news", 1)
    await api.store.report_breaker("shop", "closed", at=now_ms())
    limited = await api.get("/v1/bots", key=SHOP_KEY)
    assert limited.status_code == 200, limited.text
    (shop,) = limited.json()["items"]
    assert (shop["bot"], shop["counts"], shop["breaker"]) == ("shop", {}, "closed")
    # An open breaker past the bot's cooldown (30 s by default) may let a probe out.
    await api.store.report_breaker("news", "open", at=now_ms() - 60_000)
    await api.store.report_breaker("shop", "open", at=now_ms())
    breakers = {
        item["bot"]: item["breaker"] for item in (await api.get("/v1/bots")).json()["items"]
    }
    assert breakers == {"shop": "open", "news": "half_open", "ledger": None, "legacy": None}


# -- POST /v1/bots/{bot}/pause and resume ----------------------------------------------------


async def test_pause_holds_every_claim_of_the_bot_and_resume_releases_it(api: Api) -> None:
    await api.add("shop", 1)
    await api.add("news", 1)
    first = await api.post("/v1/bots/shop/pause", {"reason": "maintenance"}, key=OPERATOR_KEY)
    assert first.status_code == 200, first.text
    assert first.json() == {"bot": "shop", "changed": True}
    again = await api.post("/v1/bots/shop/pause", {"reason": "another"}, key=OPERATOR_KEY)
    assert again.json() == {"bot": "shop", "changed": False}
    (control,) = await api.store.bot_controls(["shop"])
    assert (control.paused, control.paused_by, control.paused_reason) == (
        True,
        OPERATOR_NAME,
        "maintenance",  # the first pause's, kept
    )
    # Telegram's updates are still recorded, and answered 200.
    webhook = await api.http.post(
        "/telegram/shop",
        content=update_body(2),
        headers={"x-telegram-bot-api-secret-token": "shop-secret"},
    )
    assert webhook.status_code == 200, webhook.text
    assert (await api.row("shop", 2)).state == "pending"
    # No claim starts an attempt of the paused bot; another bot's go on.
    assert await claim_all(api) == [("news", 1)]
    now = now_ms()
    taken = await api.store.claim_owned(
        "shop", 1, now=now, lease_until=now + 60_000, max_attempts=8, durable_exhaustion=True
    )
    assert taken is None
    assert (await api.row("shop", 1)).attempts == 0

    resumed = await api.post("/v1/bots/shop/resume", None, key=OPERATOR_KEY)
    assert resumed.status_code == 200, resumed.text
    assert resumed.json() == {"bot": "shop", "changed": True}
    assert (await api.post("/v1/bots/shop/resume", None)).json() == {
        "bot": "shop",
        "changed": False,
    }
    assert not (await api.store.bot_controls(["shop"]))[0].paused
    assert await claim_all(api) == [("shop", 1), ("shop", 2)]


async def test_pause_holds_a_plain_bots_claims_too(api: Api) -> None:
    await api.add("legacy", 1)
    assert (await api.post("/v1/bots/legacy/pause", {})).json()["changed"] is True
    now = now_ms()
    assert (
        await api.store.claim("legacy", 1, now=now, lease_until=now + 60_000, max_attempts=8)
        is None
    )
    assert (await api.post("/v1/bots/legacy/resume", None)).json()["changed"] is True
    assert (
        await api.store.claim("legacy", 1, now=now, lease_until=now + 60_000, max_attempts=8) == 1
    )


async def test_pause_without_a_body_or_reason_pauses(api: Api) -> None:
    for bot, body in [("shop", None), ("news", {}), ("ledger", {"reason": None})]:
        response = await api.post(f"/v1/bots/{bot}/pause", body)
        assert response.json() == {"bot": bot, "changed": True}, bot
        (control,) = await api.store.bot_controls([bot])
        assert (control.paused, control.paused_reason) == (True, None), bot


async def test_pause_resume_and_rate_limit_refuse_unknown_foreign_or_malformed_bots(
    api: Api,
) -> None:
    await api.add("news", 1)
    before = await snapshot(api)
    for action, body in [("pause", {}), ("resume", None), ("rate-limit", {"per_second": 1})]:
        unknown = await api.post(f"/v1/bots/ghost/{action}", body)
        assert unknown.status_code == 404, action
        assert error_of(unknown) == "no bot 'ghost' is configured", action
        foreign = await api.post(f"/v1/bots/news/{action}", body, key=SHOP_KEY)
        assert foreign.status_code == 403, action
        assert "not allowed bot 'news'" in error_of(foreign), action
        malformed = await api.post(f"/v1/bots/Shop/{action}", body)
        assert malformed.status_code == 422, action
        assert "path.bot" in error_of(malformed), action
    for body in ({"reason": ""}, {"reason": 7}, {"reason": "x" * 501}, {"why": "x"}):
        response = await api.post("/v1/bots/shop/pause", body)
        assert response.status_code == 422, body
        assert "reason" in error_of(response) or "why" in error_of(response), body
    assert await snapshot(api) == before


# -- POST /v1/bots/{bot}/rate-limit ------------------------------------------------------------


async def test_rate_limit_is_set_and_lifted(api: Api) -> None:
    response = await api.post("/v1/bots/shop/rate-limit", {"per_second": 2.5}, key=OPERATOR_KEY)
    assert response.status_code == 200, response.text
    assert response.json() == {"bot": "shop", "rate_limit_per_second": 2.5}
    (control,) = await api.store.bot_controls(["shop"])
    assert control.rate_per_second == 2.5
    whole = await api.post("/v1/bots/shop/rate-limit", {"per_second": 20})
    assert whole.json() == {"bot": "shop", "rate_limit_per_second": 20.0}
    bots = {item["bot"]: item for item in (await api.get("/v1/bots")).json()["items"]}
    assert bots["shop"]["rate_limit_per_second"] == 20.0
    assert bots["news"]["rate_limit_per_second"] is None
    lifted = await api.post("/v1/bots/shop/rate-limit", {"per_second": None})
    assert lifted.json() == {"bot": "shop", "rate_limit_per_second": None}
    assert (await api.store.bot_controls(["shop"]))[0].rate_per_second is None
    # Without a limit every attempt wanted may start.
    assert await api.store.take_tokens("shop", 50, now=now_ms()) == 50


async def test_rate_limit_refuses_a_rate_that_is_not_a_positive_number(api: Api) -> None:
    assert (await api.post("/v1/bots/shop/rate-limit", {"per_second": 3})).status_code == 200
    before = await snapshot(api)
    for body in [
        {"per_second": -1},
        {"per_second": 0},
        {"per_second": 0.0},
        {"per_second": "ten"},
        {"per_second": [1]},
        {"per_second": {"n": 1}},
        {"per_second": 1e7},
        {"per_second": 1e-300},  # paced this slowly, a redrive's due times pass BIGINT
        {"per_second": 0.0009},
        {"per_second": True},  # a number, never a boolean
        {"per_second": "10"},  # nor a string
        {},
        {"per_second": 1, "burst": 2},
    ]:
        response = await api.post("/v1/bots/shop/rate-limit", body)
        assert response.status_code == 422, body
        named = "per_second" if body.keys() <= {"per_second"} else "burst"
        assert named in error_of(response), (body, response.text)
    assert await snapshot(api) == before
    assert (await api.store.bot_controls(["shop"]))[0].rate_per_second == 3.0


# -- GET /v1/updates ---------------------------------------------------------------------------


def keys_of(response: httpx.Response) -> list[tuple[str, int]]:
    assert response.status_code == 200, response.text
    return [(item["bot"], item["update_id"]) for item in response.json()["items"]]


async def searchable(api: Api) -> int:
    """Rows of several states, types, chats and receipt times; returns the base time."""
    base = now_ms() - 1_000_000
    rows = [
        # bot, update_id, received (s after base), type, chat, text
        ("shop", 1, 1, "message", "42", "hello shop"),
        ("shop", 2, 2, "callback_query", "42", "pressed BUY"),
        ("shop", 3, 3, "message", "77", "refund please"),
        ("news", 1, 4, "message", "42", "breaking 100% news"),
        ("news", 2, 5, "edited_message", "9", "edited"),
        ("shop", 4, 6, "message", None, "no chat"),
    ]
    for bot, update_id, seconds, kind, chat, text in rows:
        body = json.dumps({"update_id": update_id, "message": {"text": text}})
        received = base + seconds * 1000
        assert await api.store.add(bot, update_id, body, received, update_type=kind, queue_key=chat)
    now = now_ms()
    shop3 = await api.store.claim_owned(
        "shop", 3, now=now, lease_until=now + 60_000, max_attempts=8, durable_exhaustion=True
    )
    assert shop3 is not None
    assert await api.store.exhaust(shop3, now, "HTTP 400: refund refused")
    news2 = await api.store.claim_owned(
        "news", 2, now=now, lease_until=now + 60_000, max_attempts=8, durable_exhaustion=True
    )
    assert news2 is not None
    assert await api.store.settle_owned(news2, Completed(now))
    return base


async def test_search_filters_rows_newest_first(api: Api) -> None:
    base = await searchable(api)
    everything = [("shop", 4), ("news", 2), ("news", 1), ("shop", 3), ("shop", 2), ("shop", 1)]
    cases: list[tuple[dict[str, str | int], list[tuple[str, int]]]] = [
        ({}, everything),
        ({"bot": "shop"}, [("shop", 4), ("shop", 3), ("shop", 2), ("shop", 1)]),
        ({"bot": "news"}, [("news", 2), ("news", 1)]),
        ({"bot": "ledger"}, []),
        ({"state": "pending"}, [("shop", 4), ("news", 1), ("shop", 2), ("shop", 1)]),
        ({"state": "abandoned"}, [("shop", 3)]),
        ({"state": "completed", "bot": "news"}, [("news", 2)]),
        ({"state": "processing"}, []),
        ({"chat": "42"}, [("news", 1), ("shop", 2), ("shop", 1)]),
        ({"chat": "42", "bot": "shop"}, [("shop", 2), ("shop", 1)]),
        ({"chat": "nobody"}, []),
        ({"update_type": "message"}, [("shop", 4), ("news", 1), ("shop", 3), ("shop", 1)]),
        ({"update_type": "callback_query"}, [("shop", 2)]),
        # received_after is inclusive, received_before exclusive.
        ({"received_after": base + 3_000}, [("shop", 4), ("news", 2), ("news", 1), ("shop", 3)]),
        ({"received_before": base + 3_000}, [("shop", 2), ("shop", 1)]),
        (
            {"received_after": base + 2_000, "received_before": base + 5_000},
            [("news", 1), ("shop", 3), ("shop", 2)],
        ),
        ({"received_after": base + 7_000}, []),
        ({"contains": "refund"}, [("shop", 3)]),
        ({"contains": "100%"}, [("news", 1)]),  # a LIKE wildcard, matched as itself
        ({"contains": "_"}, everything),  # every body has "update_id": `_` is no wildcard
        ({"contains": "e", "bot": "shop", "update_type": "message", "chat": "42"}, [("shop", 1)]),
        ({"contains": "nowhere"}, []),
    ]
    for params, expected in cases:
        response = await api.get("/v1/updates", key=VIEWER_KEY, **params)
        assert keys_of(response) == expected, params
        assert response.json()["next"] is None, params


async def test_search_items_are_the_rows_summaries(api: Api) -> None:
    await searchable(api)
    response = await api.get("/v1/updates", bot="shop", state="abandoned")
    (item,) = response.json()["items"]
    row = await api.row("shop", 3)
    assert item == {
        name: value
        for name, value in dataclasses.asdict(row).items()
        if name not in ("body", "deliveries")
    } | {"deliveries": None}  # a summary reads no deliveries
    assert item["error"] == "HTTP 400: refund refused"
    assert (item["update_type"], item["queue_key"]) == ("message", "77")
    assert "body" not in item  # a summary: the raw update is the exhaustion listing's


async def test_search_pages_visit_each_row_once_across_ties_and_bots(api: Api) -> None:
    base = now_ms() - 1_000_000
    expected = []
    # 23 rows over three bots, several received in the same millisecond.
    for index in range(23):
        bot = ("shop", "news", "ledger")[index % 3]
        received = base + (index // 4) * 1000
        await api.add(bot, 100 + index, received_at=received)
        expected.append((received, bot, 100 + index))
    expected.sort(reverse=True)  # newest first, then bot and update_id descending
    order = [(bot, update_id) for _, bot, update_id in expected]
    for params, wanted in [
        ({}, order),
        ({"bot": "shop"}, [key for key in order if key[0] == "shop"]),
        ({"contains": "hello 11"}, [key for key in order if str(key[1]).startswith("11")]),
    ]:
        for limit in (1, 2, 3, 5, 7, 23, 500):
            found: list[tuple[str, int]] = []
            after: dict[str, str] = {}
            for _ in range(30):
                response = await api.get("/v1/updates", **params, **after, limit=limit)
                page = response.json()
                assert len(page["items"]) <= limit, (params, limit)
                found += keys_of(response)
                if page["next"] is None:
                    break
                after = {"after": page["next"]}
            else:
                raise AssertionError(f"paging does not end: {params} {limit}")
            assert found == wanted, (params, limit)
    # The cursor is the last item's (received_at, bot, update_id).
    first = (await api.get("/v1/updates", limit=2)).json()
    last = first["items"][-1]
    assert first["next"] == f"{last['received_at']}:{last['bot']}:{last['update_id']}"


async def test_a_body_search_pages_through_a_bounded_window_at_a_time(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each page reads at most SEARCH_WINDOW rows of the other filters (1,000; 6 here): a page
    # may come back short, or empty, with `next` set, and paging still finds every match once.
    monkeypatch.setattr(view_methods, "SEARCH_WINDOW", 6)
    base = now_ms() - 1_000_000
    for index in range(30):
        text = "needle" if index in (0, 1, 2, 13, 29) else "hay"
        body = json.dumps({"update_id": index, "message": {"text": f"{text} {index}"}})
        assert await api.store.add("shop", index, body, base + index * 1000)
    expected = [("shop", n) for n in (29, 13, 2, 1, 0)]
    for limit in (1, 2, 3, 10):
        found: list[tuple[str, int]] = []
        sizes = []
        after: dict[str, str] = {}
        for _ in range(40):
            response = await api.get("/v1/updates", contains="needle", limit=limit, **after)
            page = response.json()
            found += keys_of(response)
            sizes.append(len(page["items"]))
            if page["next"] is None:
                break
            after = {"after": page["next"]}
        else:
            raise AssertionError(f"paging does not end: {limit}")
        assert found == expected, limit
        assert 0 in sizes, (limit, sizes)  # a window of hay alone: an empty page, not the end


async def test_search_shows_a_bots_limited_key_only_its_bots(api: Api) -> None:
    await api.add("shop", 1)
    await api.add("news", 1)
    assert keys_of(await api.get("/v1/updates", key=SHOP_KEY)) == [("shop", 1)]
    foreign = await api.get("/v1/updates", key=SHOP_KEY, bot="news")
    assert foreign.status_code == 403
    assert "not allowed bot 'news'" in error_of(foreign)


async def test_search_refuses_a_malformed_cursor_or_filter(sqlite_api: Api) -> None:
    await sqlite_api.add("shop", 1)
    malformed: list[dict[str, str | int]] = [
        {"after": "x"},
        {"after": "1:shop"},
        {"after": "shop:1"},
        {"after": "1:Shop:1"},
        {"after": "-1:shop:1"},
        {"after": "1:shop:-1"},
        {"after": "1:shop:1:2"},
        {"after": "1.5:shop:1"},
        {"after": f"{2**63}:shop:1"},
        {"after": f"1:shop:{2**63}"},
        {"after": "9" * 20 + ":shop:1"},
        {"bot": "Shop"},
        {"state": "lost"},
        {"chat": ""},
        {"update_type": ""},
        {"received_after": -1},
        {"received_before": "yesterday"},
        {"contains": ""},
        {"limit": 0},
        {"limit": 501},
    ]
    for params in malformed:
        response = await sqlite_api.get("/v1/updates", **params)
        assert response.status_code == 422, params
        (field,) = params
        assert field in error_of(response), (params, response.text)
    # The largest cursor is well-formed, and before every row (pages go newest first).
    start = await sqlite_api.get("/v1/updates", after=f"{2**63 - 1}:zzz:{2**63 - 1}")
    assert keys_of(start) == [("shop", 1)]
    end = await sqlite_api.get("/v1/updates", after="0:a:0")
    assert end.json() == {"items": [], "next": None}


async def test_search_refuses_a_nul_in_a_text_filter(api: Api) -> None:
    # PostgreSQL text cannot hold one: refused before the database is asked, on either backend.
    await api.add("shop", 1)
    for field in ("chat", "update_type", "contains"):
        response = await api.get("/v1/updates", **{field: "a\x00b"})
        assert response.status_code == 422, field
        assert field in error_of(response), field


# -- GET /v1/updates/{bot}/{update_id}/attempts ------------------------------------------------


async def test_attempts_list_every_attempt_with_outcome_status_and_worker(api: Api) -> None:
    first = await api.claim("shop", 1)
    failed_at = now_ms()
    assert await api.store.settle_owned(
        first, Failed(failed_at, failed_at, "HTTP 502: bad gateway", status=502)
    )
    second = await api.claim("shop", 1, now=failed_at + 1)
    exhausted_at = now_ms()
    assert await api.store.exhaust(second, exhausted_at, "HTTP 400: chat not found", status=400)
    response = await api.get("/v1/updates/shop/1/attempts", key=VIEWER_KEY)
    assert response.status_code == 200, response.text
    one, two = response.json()["items"]
    assert one["attempt"] == 1
    assert one["claim_id"] == first.claim_id
    assert (one["outcome"], one["status_code"], one["error"]) == (
        "failed",
        502,
        "HTTP 502: bad gateway",
    )
    assert one["ended_at"] == failed_at
    assert one["duration_ms"] == failed_at - one["started_at"] >= 0
    assert one["worker"] == api.store.worker
    assert two["attempt"] == 2
    assert two["claim_id"] == second.claim_id
    assert (two["outcome"], two["status_code"], two["error"]) == (
        "exhausted",
        400,
        "HTTP 400: chat not found",
    )
    assert two["ended_at"] == exhausted_at
    assert two["started_at"] >= one["ended_at"] - 1


async def test_attempts_tell_running_lost_and_unstarted_apart(api: Api) -> None:
    lapsed = await api.lapsed_claim("shop", 1)
    running = await api.claim("shop", 1)  # the lapsed lease is reclaimed
    done = await api.claim("shop", 2)
    assert await api.store.settle_owned(done, Completed(now_ms(), status=200))
    await api.add("shop", 3)
    items = (await api.get("/v1/updates/shop/1/attempts")).json()["items"]
    assert [(i["attempt"], i["claim_id"], i["outcome"]) for i in items] == [
        (1, lapsed.claim_id, "lost"),
        (2, running.claim_id, "running"),
    ]
    assert [(i["ended_at"], i["duration_ms"], i["status_code"]) for i in items] == [
        (None, None, None),
        (None, None, None),
    ]
    (completed,) = (await api.get("/v1/updates/shop/2/attempts")).json()["items"]
    assert (completed["outcome"], completed["status_code"], completed["error"]) == (
        "completed",
        200,
        None,
    )
    assert (await api.get("/v1/updates/shop/3/attempts")).json() == {"items": []}


async def test_attempts_of_an_update_not_recorded_are_404(api: Api) -> None:
    await api.claim("shop", 1)
    for path in (
        "/v1/updates/shop/2/attempts",
        "/v1/updates/news/1/attempts",
        "/v1/updates/ghost/1/attempts",
    ):
        response = await api.get(path)
        assert response.status_code == 404, path
    missing = await api.get("/v1/updates/shop/2/attempts")
    assert error_of(missing) == "no update 2 of bot 'shop' is recorded"
    foreign = await api.get("/v1/updates/news/1/attempts", key=SHOP_KEY)
    assert foreign.status_code == 403
    for path, field in [
        ("/v1/updates/Shop/1/attempts", "path.bot"),
        ("/v1/updates/shop/-1/attempts", "path.update_id"),
        (f"/v1/updates/shop/{2**63}/attempts", "path.update_id"),
    ]:
        response = await api.get(path)
        assert response.status_code == 422, path
        assert field in error_of(response), path


# -- POST /v1/updates/{bot}/{update_id}/park ---------------------------------------------------


def park_body(identity: ClaimIdentity, reason: str = "crashes the handler") -> dict[str, Any]:
    return {"attempt": identity.attempt, "claim_id": identity.claim_id, "reason": reason}


async def test_park_ends_the_exact_attempt_as_an_exhaustion_and_frees_its_chat(
    api: Api,
) -> None:
    for update_id in (1, 2):
        assert await api.store.add(
            "shop", update_id, update_body(update_id), now_ms(), queue_key="42"
        )
    poison = await api.claim("shop", 1)
    assert await claim_all(api) == []  # the chat waits for its head
    before = now_ms()
    response = await api.post(
        "/v1/updates/shop/1/park", park_body(poison, "crashes the handler"), key=OPERATOR_KEY
    )
    after = now_ms()
    assert response.status_code == 200, response.text
    assert response.json() == {"parked": True}
    row = await api.row("shop", 1)
    assert (row.state, row.error, row.acknowledged_at) == (
        "abandoned",
        "parked: crashes the handler",
        None,
    )
    assert row.exhausted_at is not None
    assert between(row.exhausted_at, before, after)
    listed = (await api.get("/v1/exhaustions", key=VIEWER_KEY)).json()["items"]
    assert [(i["bot"], i["update_id"], i["error"]) for i in listed] == [
        ("shop", 1, "parked: crashes the handler")
    ]
    assert listed[0]["attempt"] == poison.attempt
    assert listed[0]["claim_id"] == poison.claim_id
    (attempt,) = (await api.get("/v1/updates/shop/1/attempts")).json()["items"]
    assert (attempt["outcome"], attempt["error"]) == ("parked", "crashes the handler")
    # The parked attempt's late answer is refused; the chat moves on.
    assert not await api.store.settle_owned(poison, Completed(now_ms()))
    assert await claim_all(api) == [("shop", 2)]
    # Parked once: the same identity parks nothing again.
    assert (await api.post("/v1/updates/shop/1/park", park_body(poison))).json() == {
        "parked": False
    }


async def test_park_takes_an_attempt_waiting_for_its_retry(api: Api) -> None:
    identity = await api.claim("news", 5)
    now = now_ms()
    assert await api.store.settle_owned(identity, Failed(now, now + 600_000, "HTTP 503"))
    body = {**park_body(identity, "poison"), "bot": "news", "update_id": 5}
    response = await api.post("/v1/updates/news/5/park", body)
    assert response.json() == {"parked": True}
    row = await api.row("news", 5)
    assert (row.state, row.error) == ("abandoned", "parked: poison")


async def test_park_with_another_identity_changes_nothing(api: Api) -> None:
    identity = await api.claim("shop", 1)
    await api.add("shop", 2)
    before = await snapshot(api)
    wrong = [
        ("shop", 1, {**park_body(identity), "claim_id": NO_SUCH_CLAIM}),
        ("shop", 1, {**park_body(identity), "attempt": 2}),
        ("shop", 2, park_body(identity)),  # another update
        ("news", 1, park_body(identity)),  # another bot
    ]
    for bot, update_id, body in wrong:
        response = await api.post(f"/v1/updates/{bot}/{update_id}/park", body)
        assert response.status_code == 200, (bot, update_id, body)
        assert response.json() == {"parked": False}, (bot, update_id, body)
    assert await snapshot(api) == before
    assert await api.store.owns(identity, now_ms())


async def test_park_refuses_a_body_that_differs_from_the_path_or_is_malformed(api: Api) -> None:
    identity = await api.claim("shop", 1)
    before = await snapshot(api)
    path = "/v1/updates/shop/1/park"
    for body, named in [
        ({**park_body(identity), "bot": "news"}, "differ from the path"),
        ({**park_body(identity), "update_id": 2}, "differ from the path"),
        ({**park_body(identity), "bot": "news", "update_id": 1}, "differ from the path"),
        ({"attempt": identity.attempt, "claim_id": identity.claim_id}, "reason"),
        ({**park_body(identity), "reason": ""}, "reason"),
        ({**park_body(identity), "reason": " \t "}, "reason"),
        ({**park_body(identity), "reason": "a\x00b"}, "reason"),
        ({**park_body(identity), "reason": "x" * 501}, "reason"),
        ({**park_body(identity), "attempt": 0}, "attempt"),
        ({**park_body(identity), "attempt": "1"}, "attempt"),
        ({**park_body(identity), "claim_id": ""}, "claim_id"),
        ({**park_body(identity), "extra": 1}, "extra"),
    ]:
        response = await api.post(path, body)
        assert response.status_code == 422, body
        assert named in error_of(response), (body, response.text)
    unknown = await api.post("/v1/updates/ghost/1/park", park_body(identity))
    assert unknown.status_code in (200, 404)  # no such bot: nothing to park either way
    assert unknown.status_code == 404 or unknown.json() == {"parked": False}
    foreign = await api.post("/v1/updates/news/1/park", park_body(identity), key=SHOP_KEY)
    assert foreign.status_code == 403
    assert await snapshot(api) == before


# -- POST /v1/exhaustions/redrive --------------------------------------------------------------


async def redrivable(api: Api) -> dict[tuple[str, int], ClaimIdentity]:
    """Open exhaustions of shop and news with different errors, types and chats, among an
    acknowledged one and rows that are no exhaustion."""
    made = {}
    for bot, update_id, kind, chat, error in [
        ("shop", 1, "message", "42", "HTTP 500: boom"),
        ("shop", 2, "message", "43", "HTTP 500: boom again"),
        ("shop", 3, "callback_query", "42", "HTTP 500: boom"),
        ("shop", 4, "message", "44", "HTTP 400: bad request"),
        ("news", 1, "message", "42", "HTTP 500: boom"),
    ]:
        body = update_body(update_id)
        assert await api.store.add(bot, update_id, body, now_ms(), update_type=kind, queue_key=chat)
        made[(bot, update_id)] = await api.exhaustion(bot, update_id, error=error)
    acknowledged = await api.exhaustion("shop", 5, error="HTTP 500: old")
    assert await api.store.acknowledge_exhaustion(acknowledged, now_ms())
    await api.add("shop", 6)
    await api.claim("shop", 7)
    return made


def open_keys(response: httpx.Response) -> list[tuple[str, int]]:
    return keys_of(response)


async def listed(api: Api) -> list[tuple[str, int]]:
    return keys_of(await api.get("/v1/exhaustions", key=VIEWER_KEY))


async def test_redrive_by_filter_dry_run_then_for_real(api: Api) -> None:
    made = await redrivable(api)
    selection = {"filter": {"bot": "shop", "error_contains": "HTTP 500"}}
    before = await snapshot(api)
    dry = await api.post("/v1/exhaustions/redrive", {**selection, "dry_run": True})
    assert dry.status_code == 200, dry.text
    answer = dry.json()
    assert (answer["matched"], answer["redriven"]) == (3, 0)
    assert [(s["bot"], s["update_id"]) for s in answer["sample"]] == [
        ("shop", 1),
        ("shop", 2),
        ("shop", 3),
    ]
    sample = answer["sample"][0]
    identity = made[("shop", 1)]
    assert sample == {
        **wire(identity),
        "destination": "default",
        "error": "HTTP 500: boom",
        "exhausted_at": (await api.row("shop", 1)).exhausted_at,
    }
    assert await snapshot(api) == before  # a dry run changes nothing, nor is recorded

    started = now_ms()
    real = await api.post("/v1/exhaustions/redrive", selection, key=OPERATOR_KEY)
    finished = now_ms()
    assert real.status_code == 200, real.text
    assert (real.json()["matched"], real.json()["redriven"]) == (3, 3)
    assert real.json()["sample"] == answer["sample"]
    for update_id in (1, 2, 3):
        row = await api.row("shop", update_id)
        assert (row.state, row.exhausted_at, row.acknowledged_at) == ("failed", None, None)
        assert between(row.due_at, started, finished), update_id  # due at once: no pacing
    assert await listed(api) == [("news", 1), ("shop", 4)]
    # Each is delivered again with a fresh budget (one attempt allowed here), its attempt
    # numbers going on: no earlier identity matches again. (shop:3 waits behind shop:1, in
    # chat 42; shop:6 was pending all along.)
    assert await claim_all(api, at=now_ms() + 1_000, max_attempts=1) == [
        ("shop", 1),
        ("shop", 2),
        ("shop", 6),
    ]
    row = await api.row("shop", 1)
    assert (row.state, row.attempts) == ("processing", identity.attempt + 1)
    assert not await api.store.acknowledge_exhaustion(identity, now_ms())
    again = await api.post("/v1/exhaustions/redrive", selection)
    assert (again.json()["matched"], again.json()["redriven"]) == (0, 0)


async def test_redrive_filters_by_every_criterion(api: Api) -> None:
    made = await redrivable(api)
    times = {key: (await api.row(*key)).exhausted_at for key in made}
    shop2 = times[("shop", 2)]
    assert shop2 is not None
    cases: list[tuple[dict[str, Any], list[tuple[str, int]]]] = [
        ({"bot": "news"}, [("news", 1)]),
        ({"update_type": "callback_query"}, [("shop", 3)]),
        ({"chat": "42"}, [("news", 1), ("shop", 1), ("shop", 3)]),
        ({"chat": "42", "bot": "shop"}, [("shop", 1), ("shop", 3)]),
        ({"error_contains": "again"}, [("shop", 2)]),
        ({"error_contains": "500: boom"}, [("news", 1), ("shop", 1), ("shop", 2), ("shop", 3)]),
        ({"error_contains": "%"}, []),  # a LIKE wildcard, matched as itself
        (
            {"exhausted_after": shop2},
            sorted(key for key, at in times.items() if at is not None and at >= shop2),
        ),
        (
            {"exhausted_before": shop2},
            sorted(key for key, at in times.items() if at is not None and at < shop2),
        ),
        ({"bot": "ledger"}, []),
    ]
    for chosen, expected in cases:
        response = await api.post("/v1/exhaustions/redrive", {"filter": chosen, "dry_run": True})
        assert response.status_code == 200, (chosen, response.text)
        answer = response.json()
        assert answer["matched"] == len(expected), chosen
        assert [(s["bot"], s["update_id"]) for s in answer["sample"]] == expected, chosen


async def test_redrive_by_identities_takes_exactly_those(api: Api) -> None:
    made = await redrivable(api)
    stale = dataclasses.replace(made[("shop", 2)], claim_id=NO_SUCH_CLAIM)
    chosen = [wire(made[("shop", 1)]), wire(made[("news", 1)]), wire(stale)]
    dry = await api.post("/v1/exhaustions/redrive", {"identities": chosen, "dry_run": True})
    assert (dry.json()["matched"], dry.json()["redriven"]) == (2, 0)
    real = await api.post("/v1/exhaustions/redrive", {"identities": chosen})
    assert (real.json()["matched"], real.json()["redriven"]) == (2, 2)
    assert await listed(api) == [("shop", 2), ("shop", 3), ("shop", 4)]
    assert (await api.row("news", 1)).state == "failed"
    empty = await api.post("/v1/exhaustions/redrive", {"identities": []})
    assert (empty.json()["matched"], empty.json()["redriven"]) == (0, 0)


async def test_redrive_paces_at_the_given_rate_or_else_the_bots_limit(api: Api) -> None:
    await redrivable(api)
    started = now_ms()
    paced = await api.post(
        "/v1/exhaustions/redrive", {"filter": {"bot": "shop"}, "rate_per_second": 10}
    )
    assert paced.json()["redriven"] == 4
    due = [(await api.row("shop", update_id)).due_at for update_id in (1, 2, 3, 4)]
    assert between(due[0], started, now_ms())
    assert [later - due[0] for later in due] == [0, 100, 200, 300]  # 10 per second, key order
    # Without a rate, a redrive of one bot goes at that bot's rate limit.
    assert (await api.post("/v1/bots/news/rate-limit", {"per_second": 4})).status_code == 200
    await api.exhaustion("news", 2)
    news = await api.post("/v1/exhaustions/redrive", {"filter": {"bot": "news"}})
    assert news.json()["redriven"] == 2
    first, second = [(await api.row("news", update_id)).due_at for update_id in (1, 2)]
    assert second - first == 250
    # The slowest pace, one per 1,000 s: the due times stay far inside BIGINT.
    for update_id in (3, 4):
        await api.exhaustion("news", update_id)
    slowest = await api.post(
        "/v1/exhaustions/redrive", {"filter": {"bot": "news"}, "rate_per_second": 0.001}
    )
    assert slowest.json()["redriven"] == 2
    first, second = [(await api.row("news", update_id)).due_at for update_id in (3, 4)]
    assert second - first == 1_000_000
    await api.exhaustion("news", 5)
    before = await snapshot(api)
    for rate in (0, -1, "fast", "10", True, 1e7, 1e-300, 0.0009):
        response = await api.post(
            "/v1/exhaustions/redrive", {"filter": {"bot": "news"}, "rate_per_second": rate}
        )
        assert response.status_code == 422, rate
        assert "rate_per_second" in error_of(response), rate
    # Nor a bot's limit below the slowest pace.
    assert (await api.post("/v1/bots/news/rate-limit", {"per_second": 1e-300})).status_code == 422
    assert await snapshot(api) == before


async def test_redrive_of_everything_needs_all_true(api: Api) -> None:
    await redrivable(api)
    before = await snapshot(api)
    for body in [
        {"filter": {}},
        {"filter": {}, "all": False},
        {"filter": {"bot": None}},
    ]:
        response = await api.post("/v1/exhaustions/redrive", body, key=OPERATOR_KEY)
        assert response.status_code == 422, body
        assert "filter is empty" in error_of(response), body
        assert "all: true" in error_of(response), body
    assert await snapshot(api) == before
    dry = await api.post("/v1/exhaustions/redrive", {"filter": {}, "dry_run": True})
    assert (dry.json()["matched"], dry.json()["redriven"]) == (5, 0)
    assert await snapshot(api) == before
    every = await api.post("/v1/exhaustions/redrive", {"filter": {}, "all": True})
    assert (every.json()["matched"], every.json()["redriven"]) == (5, 5)
    assert await listed(api) == []


async def test_redrive_refuses_a_malformed_selection(api: Api) -> None:
    made = await redrivable(api)
    good = wire(made[("shop", 1)])
    before = await snapshot(api)
    for body, named in [
        ({}, "exactly one of filter and identities"),
        ({"filter": {"bot": "shop"}, "identities": [good]}, "exactly one"),
        ({"identities": [{**good, "attempt": 0}]}, "attempt"),
        ({"identities": [{**good, "claim_id": ""}]}, "claim_id"),
        ({"identities": [{**good, "bot": "Shop"}]}, "bot"),
        ({"identities": [{**good, "update_id": "1"}]}, "update_id"),
        ({"identities": [{k: v for k, v in good.items() if k != "claim_id"}]}, "claim_id"),
        ({"identities": good}, "identities"),
        ({"filter": {"bot": "Shop"}}, "bot"),
        ({"filter": {"shop": "shop"}}, "shop"),
        ({"filter": {"exhausted_after": -1}}, "exhausted_after"),
        ({"filter": {"exhausted_before": "today"}}, "exhausted_before"),
        ({"filter": {"error_contains": ""}}, "error_contains"),
        ({"filter": {"bot": "shop"}, "dry_run": "yes"}, "dry_run"),
        ({"filter": {"bot": "shop"}, "all": 1}, "all"),
    ]:
        response = await api.post("/v1/exhaustions/redrive", body)
        assert response.status_code == 422, body
        assert named in error_of(response), (body, response.text)
    # Each destination's deliveries are acted on apart (schemathesis found a 500 here).
    mixed = {"identities": [good, {**good, "destination": "payments"}]}
    for path in ("/v1/exhaustions/redrive", "/v1/exhaustions/acknowledge"):
        response = await api.post(path, mixed)
        assert response.status_code == 422, path
        assert "one action per destination" in error_of(response), response.text
    not_json = await api.http.post(
        "/v1/exhaustions/redrive",
        content=b"{not json",
        headers={"authorization": f"Bearer {KEY}", "content-type": "application/json"},
    )
    assert not_json.status_code == 400
    assert await snapshot(api) == before


async def test_redrive_of_an_unknown_or_foreign_bot_is_refused(api: Api) -> None:
    made = await redrivable(api)
    before = await snapshot(api)
    unknown = await api.post("/v1/exhaustions/redrive", {"filter": {"bot": "ghost"}})
    assert unknown.status_code == 404, unknown.text
    assert error_of(unknown) == "no bot 'ghost' is configured"
    ghost = {**wire(made[("shop", 1)]), "bot": "ghost"}
    by_identity = await api.post("/v1/exhaustions/redrive", {"identities": [ghost]})
    assert by_identity.status_code == 404, by_identity.text
    for body in [
        {"filter": {"bot": "news"}},
        {"identities": [wire(made[("news", 1)])]},
        {"identities": [wire(made[("shop", 1)]), wire(made[("news", 1)])]},
    ]:
        foreign = await api.post("/v1/exhaustions/redrive", body, key=SHOP_KEY)
        assert foreign.status_code == 403, body
        assert "not allowed bot 'news'" in error_of(foreign), body
    assert await snapshot(api) == before
    # A key limited to shop acting on every exhaustion acts on shop's only.
    limited = await api.post("/v1/exhaustions/redrive", {"filter": {}, "all": True}, key=SHOP_KEY)
    assert (limited.json()["matched"], limited.json()["redriven"]) == (4, 4)
    assert await listed(api) == [("news", 1)]


# -- POST /v1/exhaustions/acknowledge ----------------------------------------------------------


async def test_acknowledge_by_filter_dry_run_then_for_real(api: Api) -> None:
    await redrivable(api)
    selection = {"filter": {"error_contains": "HTTP 500", "chat": "42"}}
    before = await snapshot(api)
    dry = await api.post("/v1/exhaustions/acknowledge", {**selection, "dry_run": True})
    assert dry.status_code == 200, dry.text
    assert (dry.json()["matched"], dry.json()["acknowledged"]) == (3, 0)
    expected = [("news", 1), ("shop", 1), ("shop", 3)]
    assert [(s["bot"], s["update_id"]) for s in dry.json()["sample"]] == expected
    assert await snapshot(api) == before
    started = now_ms()
    real = await api.post("/v1/exhaustions/acknowledge", selection, key=OPERATOR_KEY)
    finished = now_ms()
    assert (real.json()["matched"], real.json()["acknowledged"]) == (3, 3)
    for key in expected:
        row = await api.row(*key)
        assert row.state == "abandoned", key
        assert row.acknowledged_at is not None
        assert between(row.acknowledged_at, started, finished)
        assert row.settled_at == row.acknowledged_at, key  # prunable from now on
    assert await listed(api) == [("shop", 2), ("shop", 4)]
    needs_all = await api.post("/v1/exhaustions/acknowledge", {"filter": {}})
    assert needs_all.status_code == 422
    assert "filter is empty" in error_of(needs_all)
    every = await api.post("/v1/exhaustions/acknowledge", {"filter": {}, "all": True})
    assert (every.json()["matched"], every.json()["acknowledged"]) == (2, 2)
    assert await listed(api) == []


async def test_acknowledge_by_identities_and_the_single_identity_form(api: Api) -> None:
    made = await redrivable(api)
    stale = dataclasses.replace(made[("shop", 2)], attempt=made[("shop", 2)].attempt + 1)
    bulk = await api.post(
        "/v1/exhaustions/acknowledge", {"identities": [wire(made[("shop", 1)]), wire(stale)]}
    )
    assert bulk.status_code == 200, bulk.text
    assert (bulk.json()["matched"], bulk.json()["acknowledged"]) == (1, 1)
    # The form a downstream sends, with any key that may call back: {"acknowledged": bool}.
    single = await api.post(
        "/v1/exhaustions/acknowledge", wire(made[("shop", 2)]), key=CALLBACK_KEY
    )
    assert single.json() == {"acknowledged": True}
    repeated = await api.post("/v1/exhaustions/acknowledge", wire(made[("shop", 2)]))
    assert repeated.json() == {"acknowledged": False}
    stale_one = await api.post("/v1/exhaustions/acknowledge", wire(stale), key=OPERATOR_KEY)
    assert stale_one.json() == {"acknowledged": False}
    assert await listed(api) == [("news", 1), ("shop", 3), ("shop", 4)]
    before = await snapshot(api)
    shop3 = wire(made[("shop", 3)])
    for body, named in [
        ({**shop3, "attempt": 0}, "attempt"),
        ({**shop3, "claim_id": ""}, "claim_id"),
        ({k: v for k, v in shop3.items() if k != "claim_id"}, "missing claim_id"),
        ({**shop3, "extra": 1}, "extra"),
        # The single form acts at once: a dry run of it must not acknowledge for real.
        ({**shop3, "dry_run": True}, "dry_run"),
        ({**shop3, "all": True}, "all"),
        ({**shop3, "filter": {"bot": "shop"}}, "not both"),
        ({**shop3, "identities": [shop3]}, "not both"),
    ]:
        response = await api.post("/v1/exhaustions/acknowledge", body)
        assert response.status_code == 422, body
        assert named in error_of(response), (body, response.text)
    assert await snapshot(api) == before


async def test_acknowledge_in_bulk_needs_the_operator_scope(api: Api) -> None:
    made = await redrivable(api)
    before = await snapshot(api)
    for key in (CALLBACK_KEY, VIEWER_KEY):
        for body in [
            {"filter": {"bot": "shop"}},
            {"filter": {"bot": "shop"}, "dry_run": True},
            {"identities": [wire(made[("shop", 1)])]},
        ]:
            response = await api.post("/v1/exhaustions/acknowledge", body, key=key)
            assert response.status_code == 403, (key, body)
            assert "operator scope" in error_of(response), (key, body)
    single = await api.post("/v1/exhaustions/acknowledge", wire(made[("shop", 1)]), key=VIEWER_KEY)
    assert single.status_code == 403
    assert await snapshot(api) == before
    foreign = await api.post(
        "/v1/exhaustions/acknowledge", {"filter": {"bot": "news"}}, key=SHOP_KEY
    )
    assert foreign.status_code == 403
    assert await snapshot(api) == before


# -- scopes ------------------------------------------------------------------------------------


async def test_a_viewer_reads_every_page_and_acts_on_nothing(api: Api) -> None:
    made = await redrivable(api)
    live = await api.claim("shop", 8)
    before = await snapshot(api)
    for path in (
        "/v1/bots",
        "/v1/updates",
        "/v1/updates/shop/1",
        "/v1/updates/shop/1/attempts",
        "/v1/exhaustions",
        "/v1/stats",
        "/v1/audit",
    ):
        response = await api.get(path, key=VIEWER_KEY)
        assert response.status_code == 200, (path, response.text)
        assert (await api.get(path, key=CALLBACK_KEY)).status_code == 403, path
    actions: list[tuple[str, Any]] = [
        ("/v1/bots/shop/pause", {"reason": "no"}),
        ("/v1/bots/shop/resume", None),
        ("/v1/bots/shop/rate-limit", {"per_second": 1}),
        ("/v1/updates/shop/8/park", park_body(live)),
        ("/v1/exhaustions/redrive", {"filter": {"bot": "shop"}}),
        ("/v1/exhaustions/redrive", {"identities": [wire(made[("shop", 1)])]}),
        ("/v1/exhaustions/acknowledge", {"filter": {"bot": "shop"}}),
        ("/v1/exhaustions/acknowledge", {"identities": [wire(made[("shop", 1)])]}),
    ]
    for path, body in actions:
        response = await api.post(path, body, key=VIEWER_KEY)
        assert response.status_code == 403, (path, response.text)
        assert "operator" in error_of(response), path
    # Paused by someone else, the viewer cannot resume it either.
    assert (await api.post("/v1/bots/news/pause", None)).status_code == 200
    paused = await snapshot(api)
    assert (await api.post("/v1/bots/news/resume", None, key=VIEWER_KEY)).status_code == 403
    assert await snapshot(api) == paused
    assert before[0] == paused[0]  # no row changed throughout


async def test_operator_keys_act_whatever_their_scope_is_called(api: Api) -> None:
    made = await redrivable(api)
    for key in (OPERATOR_KEY, OPERATIONS_KEY, KEY):
        pause = await api.post("/v1/bots/news/pause", None, key=key)
        assert pause.json() == {"bot": "news", "changed": True}, key
        resume = await api.post("/v1/bots/news/resume", None, key=key)
        assert resume.json() == {"bot": "news", "changed": True}, key
        dry = await api.post("/v1/exhaustions/redrive", {"filter": {}, "dry_run": True}, key=key)
        assert dry.json()["matched"] == 5, key
        assert (await api.get("/v1/audit", key=key)).status_code == 200, key
    acknowledged = await api.post(
        "/v1/exhaustions/acknowledge", {"identities": [wire(made[("news", 1)])]}, key=OPERATIONS_KEY
    )
    assert acknowledged.json()["acknowledged"] == 1
    # A callback-only key calls back, and acts on nothing.
    for path, body in [
        ("/v1/bots/news/pause", None),
        ("/v1/exhaustions/redrive", {"filter": {}, "all": True}),
    ]:
        assert (await api.post(path, body, key=CALLBACK_KEY)).status_code == 403, path


# -- GET /v1/audit -----------------------------------------------------------------------------


async def test_every_action_is_in_the_audit_log_under_its_keys_name(api: Api) -> None:
    made = await redrivable(api)
    live = await api.claim("shop", 8)
    started = now_ms()
    steps: list[tuple[str, str, Any]] = [
        (OPERATOR_KEY, "/v1/bots/shop/pause", {"reason": "deploy"}),
        (OPERATOR_KEY, "/v1/bots/shop/pause", {"reason": "again"}),  # no change: not recorded
        (KEY, "/v1/bots/shop/resume", None),
        (KEY, "/v1/bots/shop/resume", None),  # no change: not recorded
        (OPERATOR_KEY, "/v1/bots/news/rate-limit", {"per_second": 2.5}),
        (KEY, "/v1/bots/news/rate-limit", {"per_second": None}),
        (OPERATOR_KEY, "/v1/updates/shop/8/park", park_body(live, "poison")),
        (KEY, "/v1/exhaustions/redrive", {"filter": {"bot": "shop", "chat": "42"}}),
        (KEY, "/v1/exhaustions/redrive", {"filter": {}, "dry_run": True}),  # not recorded
        (OPERATOR_KEY, "/v1/exhaustions/acknowledge", {"identities": [wire(made[("news", 1)])]}),
        (SHOP_KEY, "/v1/exhaustions/acknowledge", {"filter": {}, "all": True}),
    ]
    for key, path, body in steps:
        response = await api.post(path, body, key=key)
        assert response.status_code == 200, (path, response.text)
    finished = now_ms()
    response = await api.get("/v1/audit", key=VIEWER_KEY)
    assert response.status_code == 200, response.text
    page = response.json()
    assert page["next"] is None
    items = list(reversed(page["items"]))  # newest first: read them in order
    shop_label = "key-4"  # unnamed, fourth in API_KEYS
    park_target = "shop/8"
    assert [(i["key_name"], i["action"], i["target"]) for i in items] == [
        (OPERATOR_NAME, "pause", "shop"),
        (KEY_LABEL, "resume", "shop"),
        (OPERATOR_NAME, "rate_limit", "news"),
        (KEY_LABEL, "rate_limit", "news"),
        (OPERATOR_NAME, "park", park_target),
        (KEY_LABEL, "redrive", "shop"),
        (OPERATOR_NAME, "acknowledge", "news"),
        (shop_label, "acknowledge", "shop"),
    ]
    assert [i["detail"] for i in items] == [
        {"reason": "deploy"},
        None,
        {"per_second": 2.5},
        {"per_second": None},
        {"attempt": live.attempt, "reason": "poison"},
        {"filter": {"bots": ["shop"], "chat": "42"}, "rate_per_second": None},
        {"identities": [f"news/1/{made[('news', 1)].attempt}"]},
        {"filter": {"bots": ["shop"]}},
    ]
    # shop:1 and shop:3 are in chat 42; after the park and the redrive, shop holds 2, 4, 8.
    assert [(i["matched"], i["changed"]) for i in items] == [
        (None, None),
        (None, None),
        (None, None),
        (None, None),
        (1, 1),
        (2, 2),
        (1, 1),
        (3, 3),
    ]
    ids = [i["id"] for i in items]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    assert all(between(i["at"], started, finished) for i in items)
    # No key is ever shown, whatever its scope.
    for key in (KEY, OPERATOR_KEY, SHOP_KEY, VIEWER_KEY, CALLBACK_KEY, OPERATIONS_KEY):
        assert key not in response.text
    assert VIEWER_NAME not in response.text  # the viewer read, and acted on nothing
    # Every reader sees the same log.
    assert (await api.get("/v1/audit", key=KEY)).json() == page


async def test_the_audit_log_pages_newest_first(api: Api) -> None:
    for index in range(7):
        response = await api.post(
            "/v1/bots/shop/rate-limit", {"per_second": index + 1}, key=OPERATOR_KEY
        )
        assert response.status_code == 200
    found: list[dict[str, Any]] = []
    after: dict[str, int] = {}
    for _ in range(10):
        page = (await api.get("/v1/audit", limit=3, **after)).json()
        found += page["items"]
        if page["next"] is None:
            break
        assert page["next"] == page["items"][-1]["id"]
        after = {"after": page["next"]}
    rates = [item["detail"]["per_second"] for item in found]
    assert rates == [7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0]
    for params in ({"after": 0}, {"after": "x"}, {"limit": 0}, {"limit": 501}):
        response = await api.get("/v1/audit", **params)
        assert response.status_code == 422, params
        (field,) = params
        assert field in error_of(response), params
