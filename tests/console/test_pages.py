"""The console over HTTP, without a browser (docs/contract.md section 10): sign-in and its cookie,
CSRF, a viewer who sees and cannot act, the security headers, every page with rows in it, each
action through its form (recorded in the audit log under the key's name), and bad input answered
with a clear error and nothing changed. tests/console/test_browser.py drives the same pages in
Chromium."""

from __future__ import annotations

import httpx
import pytest

from tests.api.conftest import (
    KEY,
    OPERATOR_KEY,
    OPERATOR_NAME,
    SHOP_KEY,
    VIEWER_KEY,
    now_ms,
    serving,
)
from tests.conftest import Storage
from tests.console.conftest import Console

PAGES = ("/console", "/console/bots", "/console/updates", "/console/exhaustions", "/console/audit")
KEYS = (KEY, OPERATOR_KEY, SHOP_KEY, VIEWER_KEY)


async def test_every_page_sends_a_stranger_to_sign_in(console: Console) -> None:
    for path in (*PAGES, "/console/overview.part", "/console/updates/shop/1"):
        answer = await console.get(path)
        assert answer.status_code == 303, path
        assert answer.headers["location"] == "/console/sign-in"
    refused = await console.http.post("/console/bots/shop/pause", data={"csrf": "x"})
    assert refused.status_code == 303
    assert (await console.api.store.bot_controls(["shop"]))[0].paused is False


async def test_signing_in_sets_a_strict_http_only_cookie_that_names_the_key_only(
    console: Console,
) -> None:
    form = await console.get("/console/sign-in")
    assert 'type="password"' in form.text
    assert "<label" in form.text
    wrong = await console.http.post("/console/sign-in", data={"key": "not-a-key-at-all-0123"})
    assert wrong.status_code == 401
    assert "not valid" in wrong.text
    assert "set-cookie" not in wrong.headers
    answer = await console.sign_in(OPERATOR_KEY)
    assert answer.status_code == 303
    cookie = answer.headers["set-cookie"]
    assert "HttpOnly" in cookie
    assert "SameSite=strict" in cookie or "SameSite=Strict" in cookie
    assert "Path=/console" in cookie
    assert "Max-Age=28800" in cookie
    assert "Secure" not in cookie  # plain HTTP here; over HTTPS it is Secure
    assert OPERATOR_KEY not in cookie
    page = await console.get("/console")
    assert page.status_code == 200
    assert OPERATOR_NAME in page.text
    for path in PAGES:
        assert OPERATOR_KEY not in (await console.get(path)).text


async def test_a_tampered_or_foreign_cookie_is_no_session(console: Console) -> None:
    await console.sign_in(VIEWER_KEY)
    value = console.http.cookies["intake_console"]
    console.http.cookies.clear()
    forged = value[:-4] + ("AAAA" if not value.endswith("AAAA") else "BBBB")
    console.http.cookies.set("intake_console", forged, path="/console")
    assert (await console.get("/console")).status_code == 303
    console.http.cookies.clear()
    console.http.cookies.set("intake_console", "e30.notsigned", path="/console")
    assert (await console.get("/console")).status_code == 303


async def test_sign_out_ends_the_session(console: Console) -> None:
    await console.sign_in(KEY)
    answer = await console.act("/console/sign-out")
    assert answer.status_code == 303
    assert (
        'intake_console=""' in answer.headers["set-cookie"]
        or "Max-Age=0" in answer.headers["set-cookie"]
    )
    assert (await console.get("/console")).status_code == 303


async def test_every_page_carries_the_security_headers(console: Console) -> None:
    await console.sign_in(KEY)
    for path in (*PAGES, "/console/sign-in", "/console/updates/shop/404"):
        answer = await console.get(path)
        policy = answer.headers["content-security-policy"]
        assert "script-src 'self'" in policy, path
        assert "frame-ancestors 'none'" in policy, path
        assert "unsafe-inline" not in policy, path
        assert answer.headers["x-content-type-options"] == "nosniff", path
        assert answer.headers["cache-control"] == "no-store", path
        assert "<script>" not in answer.text, path  # no inline script
        assert " style=" not in answer.text, path


async def test_the_stylesheet_and_script_are_served_as_what_they_are(console: Console) -> None:
    for name, kind in (("console.css", "text/css"), ("console.js", "text/javascript")):
        answer = await console.get(f"/console/static/{name}")
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith(kind), name
        assert answer.headers["x-content-type-options"] == "nosniff"


async def test_a_viewer_finds_no_action_and_a_hand_made_post_is_refused(console: Console) -> None:
    await console.api.exhaustion("shop", 1)
    await console.api.claim("shop", 2)
    await console.sign_in(VIEWER_KEY)
    for path in (*PAGES, "/console/updates/shop/1", "/console/updates/shop/2"):
        page = await console.get(path)
        assert page.status_code == 200, path
        assert page.text.count('method="post"') == 1, path  # signing out, nothing else
    for path, fields in [
        ("/console/bots/shop/pause", {"reason": "no"}),
        ("/console/bots/shop/rate-limit", {"per_second": "5"}),
        ("/console/exhaustions/redrive", {"bot": "shop"}),
        ("/console/exhaustions/acknowledge", {"bot": "shop"}),
    ]:
        refused = await console.act(path, **fields)
        assert refused.status_code == 403, path
        assert "may view, not act" in refused.text
    assert (await console.api.store.bot_controls(["shop"]))[0].paused is False
    assert len(await console.api.store.due_exhaustions(limit=10)) == 1
    assert await console.api.store.audit_log() == []


async def test_a_post_without_this_sessions_csrf_token_changes_nothing(console: Console) -> None:
    await console.sign_in(KEY)
    async with httpx.AsyncClient(base_url=console.api.base) as client:
        other = Console(console.api, client)
        await other.sign_in(KEY)  # another session of the same key: its own token
    assert other.csrf not in ("", console.csrf)
    for fields in ({"reason": "x"}, {"csrf": ""}, {"csrf": "forged"}, {"csrf": other.csrf}):
        answer = await console.http.post("/console/bots/shop/pause", data=fields)
        assert answer.status_code == 403, fields
        assert "did not come from this console" in answer.text
    assert (await console.api.store.bot_controls(["shop"]))[0].paused is False
    assert (await console.act("/console/bots/shop/pause")).status_code == 303  # its own token


async def test_pause_resume_and_rate_limit_through_the_bots_page(console: Console) -> None:
    await console.sign_in(OPERATOR_KEY)
    page = await console.get("/console/bots")
    assert "Pause shop" in page.text
    assert "Set the rate limit of shop" in page.text
    paused = await console.act("/console/bots/shop/pause", reason="deploy")
    assert paused.status_code == 303
    assert paused.headers["location"] == "/console/bots"
    page = await console.get("/console/bots")
    assert f"paused by {OPERATOR_NAME} (deploy)" in page.text
    assert "Resume shop" in page.text
    assert (await console.act("/console/bots/shop/rate-limit", per_second="2.5")).status_code == 303
    assert (await console.api.store.bot_controls(["shop"]))[0].rate_per_second == 2.5
    assert (await console.act("/console/bots/shop/resume")).status_code == 303
    assert (await console.act("/console/bots/shop/rate-limit", per_second="")).status_code == 303
    control = (await console.api.store.bot_controls(["shop"]))[0]
    assert (control.paused, control.rate_per_second) == (False, None)
    actions = [(e.key_name, e.action) for e in await console.api.store.audit_log()]
    assert actions == [
        (OPERATOR_NAME, "rate_limit"),
        (OPERATOR_NAME, "resume"),
        (OPERATOR_NAME, "rate_limit"),
        (OPERATOR_NAME, "pause"),
    ]
    audit = await console.get("/console/audit")
    assert audit.text.count(OPERATOR_NAME) >= 4


@pytest.mark.parametrize(
    ("path", "fields", "message"),
    [
        ("/console/bots/shop/rate-limit", {"per_second": "-1"}, "per_second"),
        ("/console/bots/shop/rate-limit", {"per_second": "fast"}, "not a number"),
        ("/console/bots/ghost/pause", {}, "ghost"),
        ("/console/exhaustions/redrive", {}, "name what to act on"),
        ("/console/exhaustions/redrive", {"bot": "shop", "rate_per_second": "0"}, "rate"),
        ("/console/updates/shop/1/park", {"attempt": "1", "claim_id": "x"}, "reason"),
        ("/console/updates/shop/1/park", {"attempt": "one", "reason": "r"}, "attempt"),
    ],
)
async def test_bad_input_is_a_clear_error_and_changes_nothing(
    console: Console, path: str, fields: dict[str, str], message: str
) -> None:
    await console.api.exhaustion("shop", 1)
    await console.sign_in(KEY)
    answer = await console.act(path, **fields)
    assert answer.status_code in (400, 404), answer.text
    assert message in answer.text
    assert 'role="alert"' in answer.text
    control = (await console.api.store.bot_controls(["shop"]))[0]
    assert (control.paused, control.rate_per_second) == (False, None)
    assert len(await console.api.store.due_exhaustions(limit=10)) == 1
    assert await console.api.store.audit_log() == []


async def test_a_form_must_be_small_and_url_encoded(console: Console) -> None:
    await console.sign_in(KEY)
    huge = await console.http.post(
        "/console/sign-in",
        content=b"key=" + b"x" * 40_000,
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert huge.status_code == 413
    other = await console.http.post("/console/sign-in", json={"key": KEY})
    assert other.status_code == 415


async def test_updates_search_pages_and_links_each_row_to_its_detail(console: Console) -> None:
    start = now_ms() - 10_000
    for update_id in range(1, 56):
        await console.api.add("shop", update_id, received_at=start + update_id)
    await console.sign_in(KEY)
    first = await console.get("/console/updates", bot="shop")
    assert first.text.count('href="/console/updates/shop/') == 50
    assert "shop 55" in first.text
    assert "shop 6<" in first.text
    following = first.text.split('rel="next"')[0].rsplit('href="', 1)[1].split('"')[0]
    second = await console.get(following.replace("&amp;", "&"))
    assert second.text.count('href="/console/updates/shop/') == 5
    assert 'rel="next"' not in second.text
    found = await console.get("/console/updates", bot="shop", contains="hello 42")
    assert "shop 42" in found.text
    assert "shop 41" not in found.text
    bad = await console.get("/console/updates", state="lost")
    assert bad.status_code == 400
    assert "is not one of pending, processing, completed, failed, abandoned" in bad.text
    when = await console.get("/console/updates", received_after="yesterday")
    assert when.status_code == 400
    assert "is not a time" in when.text


async def test_an_update_shows_its_body_history_and_the_actions_that_apply(
    console: Console,
) -> None:
    exhausted = await console.api.exhaustion("shop", 1, error="HTTP 400: no such chat")
    live = await console.api.claim("shop", 2)
    await console.sign_in(OPERATOR_KEY)
    page = await console.get("/console/updates/shop/1")
    assert "&#34;update_id&#34;: 1" in page.text or '"update_id": 1' in page.text
    assert "Attempt 1: exhausted" in page.text
    assert "HTTP 400: no such chat" in page.text
    assert "Redrive this update" in page.text
    assert "Acknowledge this exhaustion" in page.text
    assert "Park this update" not in page.text
    running = await console.get("/console/updates/shop/2")
    assert "Attempt 1: running" in running.text
    assert "Park this update" in running.text
    parked = await console.act(
        "/console/updates/shop/2/park",
        attempt=str(live.attempt),
        claim_id=live.claim_id,
        reason="poison",
    )
    assert parked.status_code == 303
    assert (await console.api.row("shop", 2)).error == "parked: poison"
    again = await console.act(
        "/console/updates/shop/2/park",
        attempt=str(live.attempt),
        claim_id=live.claim_id,
        reason="x",
    )
    assert again.status_code == 409
    redriven = await console.act(
        "/console/updates/shop/1/redrive",
        attempt=str(exhausted.attempt),
        claim_id=exhausted.claim_id,
    )
    assert redriven.status_code == 303
    assert (await console.api.row("shop", 1)).state == "failed"
    missing = await console.get("/console/updates/shop/999")
    assert missing.status_code == 404


async def test_a_bulk_redrive_shows_its_dry_run_count_then_takes_what_was_confirmed(
    console: Console,
) -> None:
    for update_id in (1, 2, 3):
        await console.api.exhaustion("shop", update_id)
    await console.api.exhaustion("news", 1)
    await console.sign_in(KEY)
    listed = await console.get("/console/exhaustions", bot="shop")
    assert "<strong>3</strong> open exhaustions match" in listed.text
    dry = await console.get("/console/exhaustions", bot="shop", preview="redrive")
    assert "Confirm: redrive 3 exhaustions" in dry.text
    assert "Redrive 3 exhaustions" in dry.text
    assert len(await console.api.store.due_exhaustions(limit=10)) == 4  # a dry run changes nothing
    done = await console.act("/console/exhaustions/redrive", bot="shop", count="3")
    assert done.status_code == 303
    result = await console.get(done.headers["location"])
    assert "Redrove 3 exhaustions" in result.text
    left = await console.api.store.due_exhaustions(limit=10)
    assert [e.identity.bot for e in left] == ["news"]
    every = await console.get("/console/exhaustions", preview="acknowledge")
    assert 'name="all" value="yes"' in every.text
    acked = await console.act("/console/exhaustions/acknowledge", all="yes", count="1")
    assert acked.status_code == 303
    assert await console.api.store.due_exhaustions(limit=10) == []


async def test_the_overview_counts_states_exhaustions_and_the_last_hour(console: Console) -> None:
    await console.api.exhaustion("shop", 1)
    await console.api.add("shop", 2)
    await console.api.store.pause("news", at=now_ms(), by="someone", reason="maintenance")
    await console.sign_in(KEY)
    page = await console.get("/console")
    assert page.status_code == 200
    shop = page.text.split('id="bot-shop"')[1].split("</section>")[0]
    assert '<td data-state="pending">1</td>' in shop
    assert 'href="/console/exhaustions?bot=shop">1</a>' in shop
    assert "2 in" in shop
    assert "<polyline" in shop
    news = page.text.split('id="bot-news"')[1].split("</section>")[0]
    assert "paused" in news
    assert "maintenance" in news
    part = await console.get("/console/overview.part")
    assert 'id="bot-shop"' in part.text
    assert "<html" not in part.text


async def test_a_key_limited_to_a_bot_sees_only_that_bot(console: Console) -> None:
    await console.api.exhaustion("news", 1)
    await console.sign_in(SHOP_KEY)
    page = await console.get("/console")
    assert 'id="bot-shop"' in page.text
    assert 'id="bot-news"' not in page.text
    assert (await console.get("/console/updates/news/1")).status_code == 404
    assert (await console.act("/console/bots/news/pause")).status_code == 404
    listed = await console.get("/console/exhaustions")
    assert "<strong>0</strong> open exhaustions match" in listed.text


async def test_the_cookie_is_secure_behind_a_trusted_proxy_that_says_https(
    sqlite_storage: Storage,
) -> None:
    said = {"x-forwarded-proto": "https"}
    async with (
        serving(sqlite_storage.url(), trusted_proxies="127.0.0.1/32") as api,
        httpx.AsyncClient(base_url=api.base) as client,
    ):
        behind = await client.post("/console/sign-in", data={"key": KEY}, headers=said)
        plain = await client.post("/console/sign-in", data={"key": KEY})
    assert "Secure" in behind.headers["set-cookie"]
    assert "Secure" not in plain.headers["set-cookie"]
    async with (  # no trusted proxy: the header is not read
        serving(sqlite_storage.url()) as api,
        httpx.AsyncClient(base_url=api.base) as client,
    ):
        untrusted = await client.post("/console/sign-in", data={"key": KEY}, headers=said)
    assert "Secure" not in untrusted.headers["set-cookie"]
