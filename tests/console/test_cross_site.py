"""A POST to the console from another site is refused before anything is done (docs/contract.md
section 16: "a browser's cross-site POST cannot sign anyone in"): `Sec-Fetch-Site` cross-site or
same-site, or an `Origin` other than the console's own, is 403 with no cookie and no change.
A request with neither header (curl, an old browser) passes, guarded by the SameSite=Strict
cookie and the CSRF token."""

from __future__ import annotations

import httpx
import pytest

from tests.api.conftest import KEY, serving
from tests.conftest import Storage
from tests.console.conftest import Console

EVIL = "https://evil.example"
FOREIGN = (
    {"origin": EVIL, "sec-fetch-site": "cross-site"},
    {"origin": EVIL},
    {"sec-fetch-site": "cross-site"},
    {"sec-fetch-site": "same-site"},  # a sibling subdomain is another site's code too
    {"origin": "null"},
    {"origin": "http://127.0.0.1:1"},  # this host, another port
    {"origin": "https://127.0.0.1"},  # another scheme
)


async def signed_in_afterwards(console: Console) -> bool:
    answer = await console.get("/console")
    return answer.status_code == 200


@pytest.mark.parametrize("headers", FOREIGN)
async def test_a_cross_site_sign_in_with_a_valid_key_is_403_and_signs_no_one_in(
    console: Console, headers: dict[str, str]
) -> None:
    answer = await console.http.post("/console/sign-in", data={"key": KEY}, headers=headers)
    assert answer.status_code == 403, answer.text
    assert "from another site" in answer.text
    assert "set-cookie" not in answer.headers
    assert "content-security-policy" in answer.headers
    assert not await signed_in_afterwards(console)


async def test_a_same_origin_sign_in_or_one_without_the_headers_succeeds(
    console: Console,
) -> None:
    own = console.api.base  # http://127.0.0.1:<port>
    for headers in (
        {"origin": own, "sec-fetch-site": "same-origin"},
        {"origin": own},
        {"sec-fetch-site": "none"},  # typed by the person, no page behind it
        # A browser's own word wins over Origin against Host, which a proxy may rewrite
        # (nginx's default sends the upstream's address as Host).
        {"origin": "https://console.example", "sec-fetch-site": "same-origin"},
        {},
    ):
        console.http.cookies.clear()
        answer = await console.http.post("/console/sign-in", data={"key": KEY}, headers=headers)
        assert answer.status_code == 303, (headers, answer.text)
        assert "intake_console=" in answer.headers["set-cookie"]
        assert await signed_in_afterwards(console), headers


async def test_an_action_posted_from_another_origin_is_refused_and_changes_nothing(
    console: Console,
) -> None:
    await console.sign_in(KEY)
    foreign = {"csrf": console.csrf, "reason": "r"}
    refused = await console.http.post(
        "/console/bots/shop/pause", data=foreign, headers={"origin": EVIL}
    )
    assert refused.status_code == 403, refused.text
    assert (await console.api.store.bot_controls(["shop"]))[0].paused is False
    out = await console.http.post(
        "/console/sign-out", data={"csrf": console.csrf}, headers={"sec-fetch-site": "cross-site"}
    )
    assert out.status_code == 403
    assert await signed_in_afterwards(console)  # the session did not end
    own = await console.http.post(
        "/console/bots/shop/pause", data=foreign, headers={"origin": console.api.base}
    )
    assert own.status_code == 303, own.text
    assert (await console.api.store.bot_controls(["shop"]))[0].paused is True


async def test_behind_a_trusted_proxy_the_origin_is_the_one_it_names(
    sqlite_storage: Storage,
) -> None:
    said = {
        "x-forwarded-proto": "https",
        "x-forwarded-host": "console.example",
        "origin": "https://console.example",
    }
    async with (
        serving(sqlite_storage.url(), trusted_proxies="127.0.0.1/32") as api,
        httpx.AsyncClient(base_url=api.base) as client,
    ):
        behind = await client.post("/console/sign-in", data={"key": KEY}, headers=said)
        other = {**said, "origin": "https://evil.example"}
        foreign = await client.post("/console/sign-in", data={"key": KEY}, headers=other)
    assert behind.status_code == 303, behind.text
    assert foreign.status_code == 403
    async with (  # no trusted proxy: its headers are not read
        serving(sqlite_storage.url()) as api,
        httpx.AsyncClient(base_url=api.base) as client,
    ):
        untrusted = await client.post("/console/sign-in", data={"key": KEY}, headers=said)
    assert untrusted.status_code == 403
    assert "set-cookie" not in untrusted.headers
