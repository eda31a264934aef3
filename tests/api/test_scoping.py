"""One scoping rule everywhere (docs/security.md): a key limited to some bots sees nothing of
another bot, in any family (rows, attempts, exhaustions, metrics, audit) of the API or the
console, and acts on nothing of it.

Every route is enumerated from the app itself, so a route added later is checked without being
listed here: each is asked, with the key limited to `shop`, for `shop`'s things and for the
other bot's, and no answer may carry anything of the other bot that the request did not name.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from app.store import ClaimIdentity, ExhaustionFilter, Failed
from tests.api.conftest import BOTS, SHOP_KEY, Api, _bot, bearer, now_ms, serving, update_body
from tests.api.test_auth import _routes
from tests.conftest import Storage
from tests.console.conftest import Console

OURS, THEIRS = "shop", "rivalbot"
# What only `rivalbot` holds: text in its bodies, errors and reasons, and its update ids.
SECRET = "rival-private"
THEIR_IDS = (990_001, 990_002, 990_003)
# Routes that are not reads or acts on a bot's things: Telegram's own (its secret, not a
# key), the console's static files, and signing in and out (tested on their own).
NOT_SCOPED = {"/telegram/{bot}", "/console/static", "/console/sign-in", "/console/sign-out"}


async def _seed(api: Api) -> dict[str, Any]:
    """Each bot with a row in every state worth showing, attempts, an open exhaustion, a
    pause and audit entries; `rivalbot`'s text all marked SECRET. Returns rivalbot's identities."""
    store, now = api.store, now_ms()
    found: dict[str, Any] = {}
    for bot, ids, mark in ((OURS, (1, 2, 3), "shop-own"), (THEIRS, THEIR_IDS, SECRET)):
        exhausted = await api.exhaustion(bot, ids[0], error=f"HTTP 400: {mark} exhaustion")
        failing = await api.claim(bot, ids[1])
        assert await store.settle_owned(
            failing, Failed(now, now + 3_600_000, f"HTTP 502: {mark} failure", status=502)
        )
        live = await api.claim(bot, ids[2])
        await store.redrive(ExhaustionFilter(bots=(bot,), chat=mark), at=now, by="ops")
        await store.acknowledge_exhaustions([exhausted], at=now, by="ops", dry_run=True)
        await store.park(live, at=now, by="ops", reason=f"{mark} poison")
        exhausted = await api.exhaustion(bot, ids[2] + 10, error=f"HTTP 400: {mark} again")
        await store.pause(bot, at=now, by="ops", reason=f"{mark} incident #42")
        await store.set_rate_limit(bot, 3.0, at=now, by="ops")
        # An erasure job each (a dry run): ours is 1, theirs 2 (`_paths`).
        await store.request_erasure(bot, kind="user", subject=7, at=now, by="ops", dry_run=True)
        found[bot] = {"exhausted": exhausted, "failing": failing, "parked": live}
    # A body that carries the secret too, and a row of rivalbot alone in a chat.
    await store.add(THEIRS, 990_100, update_body(990_100).replace("hello", SECRET), now)
    return found[THEIRS]


def _leaks(answer: httpx.Response, identities: list[ClaimIdentity], asked: str) -> list[str]:
    """What of `rivalbot` an answer shows that the request (`asked`: its path and what it sent)
    did not name itself: its marked text, its update ids and claims, its name."""
    markers = [SECRET, THEIRS, *(str(n) for n in (*THEIR_IDS, 990_013, 990_100))]
    markers += [identity.claim_id for identity in identities]
    shown = answer.text + str(answer.headers)
    return [marker for marker in markers if marker in shown and marker not in asked]


def _paths(template: str, identities: list[ClaimIdentity]) -> list[str]:
    """The route's path filled in for our bot and for theirs, each of their updates and each
    action the path may name."""
    filled = []
    for bot, update_ids in ((OURS, (1, 2, 3, 13)), (THEIRS, [i.update_id for i in identities])):
        for update_id in update_ids:
            for action in ("redrive", "acknowledge", "park"):
                path = template.replace("{bot}", bot).replace("{update_id}", str(update_id))
                erasure = "1" if bot == OURS else "2"  # as `_seed` requested them
                filled.append(path.replace("{action}", action).replace("{erasure_id}", erasure))
    return sorted(set(filled))


def _api_bodies(identities: list[ClaimIdentity]) -> list[Any]:
    """What a POST to the API may carry about `rivalbot`: its identities, filters naming it, and
    filters naming no bot (which the key's bots must bound)."""
    bodies: list[Any] = [{}, {"filter": {}, "dry_run": True}, {"filter": {"bot": THEIRS}}]
    bodies += [{"bot": THEIRS, "user_id": THEIR_IDS[0]}, {"bot": THEIRS, "chat_id": 1}]
    for identity in identities:
        wire = {
            "bot": identity.bot,
            "update_id": identity.update_id,
            "attempt": identity.attempt,
            "claim_id": identity.claim_id,
        }
        bodies += [
            wire,
            {**wire, "outcome": "completed"},
            {**wire, "reason": "by hand"},
            {"identities": [wire], "dry_run": False},
            {"filter": {"bot": THEIRS}, "dry_run": False},
        ]
    return bodies


@pytest.fixture
async def scoped(storage: Storage) -> AsyncIterator[tuple[Api, list[ClaimIdentity]]]:
    bots = (*(bot for bot in BOTS if bot.name == OURS), _bot(THEIRS))
    async with serving(storage.url(), bots=bots) as api:
        theirs = await _seed(api)
        yield api, [theirs["exhausted"], theirs["failing"], theirs["parked"]]


async def _state(api: Api) -> Any:
    """Everything of `rivalbot` an action could change."""
    rows = [await api.store.get_update(THEIRS, n) for n in (*THEIR_IDS, 990_013, 990_100)]
    controls = await api.store.bot_controls([THEIRS])
    return rows, controls


async def test_a_key_of_one_bot_sees_nothing_of_another_through_any_api_route(
    scoped: tuple[Api, list[ClaimIdentity]],
) -> None:
    api, identities = scoped
    before = await _state(api)
    routes = dict(_routes(api.app.routes))
    asked = 0
    answered_ours = set()
    for template, methods in sorted(routes.items()):
        if template in NOT_SCOPED or template.startswith("/console"):
            continue
        for path in _paths(template, identities):
            for method in sorted(methods):
                if method == "GET":
                    requests = [{"params": {}}, {"params": {"bot": THEIRS}}]
                    requests += [{"params": {"bot": OURS, "contains": SECRET}}]
                else:
                    requests = [{"json": body} for body in _api_bodies(identities)]
                for request in requests:
                    answer = await api.http.request(
                        method, path, headers=bearer(SHOP_KEY), **request
                    )
                    asked += 1
                    asked_for = path + json.dumps(request)
                    leaks = _leaks(answer, identities, asked_for)
                    assert not leaks, (method, path, request, answer.status_code, leaks)
                    assert answer.status_code < 500, (method, path, answer.text)
                    if method == "GET" and THEIRS not in asked_for and answer.status_code == 200:
                        answered_ours.add(template)
    # The check saw real answers: every read of the API answered the key with its own bot's.
    reads = {p for p, m in routes.items() if "GET" in m and p.startswith(("/v1", "/metrics"))}
    assert reads - answered_ours == set(), "reads that never answered 200"
    assert {"/v1/audit", "/v1/exhaustions", "/v1/updates", "/metrics"} <= answered_ours
    assert asked > 200
    assert await _state(api) == before, "an act of the limited key changed the other bot"


async def test_a_key_of_one_bot_sees_nothing_of_another_on_any_console_page(
    scoped: tuple[Api, list[ClaimIdentity]],
) -> None:
    api, identities = scoped
    before = await _state(api)
    async with httpx.AsyncClient(base_url=api.base, timeout=30) as client:
        console = Console(api, client)
        assert (await console.sign_in(SHOP_KEY)).status_code == 303
        routes = dict(_routes(api.app.routes))
        pages = 0
        for template, methods in sorted(routes.items()):
            if template in NOT_SCOPED or not template.startswith("/console"):
                continue
            for path in _paths(template, identities):
                for method in sorted(methods):
                    if method == "GET":
                        variants: list[dict[str, str]] = [{}, {"bot": THEIRS}]
                        variants += [{"preview": "redrive"}, {"contains": SECRET}]
                        answers = [await console.get(path, **v) for v in variants]
                    else:
                        forms = [{}, {"bot": THEIRS, "all": "yes"}, {"all": "yes", "count": "9"}]
                        forms += [
                            {"attempt": str(i.attempt), "claim_id": i.claim_id, "reason": "x"}
                            for i in identities
                        ]
                        variants = forms
                        answers = [await console.act(path, **form) for form in forms]
                    for variant, answer in zip(variants, answers, strict=True):
                        asked_for = path + json.dumps(variant)
                        leaks = _leaks(answer, identities, asked_for)
                        assert not leaks, (method, path, variant, answer.status_code, leaks)
                        assert answer.status_code < 500, (method, path, answer.text)
                        if method == "GET" and THEIRS not in asked_for:
                            pages += answer.status_code == 200
        # Still signed in, and the pages answered with the key's own bot.
        overview = await console.get("/console/audit")
        assert overview.status_code == 200
        assert "shop-own incident #42" in overview.text
        assert pages >= 10
    assert await _state(api) == before, "an act of the limited key changed the other bot"
