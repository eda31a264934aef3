"""The console in a real browser (docs/contract.md section 10): Debian's Chromium driven by
Playwright, by role and label as a person would, against a real `run` process on SQLite and real
`serve` and `worker` processes on PostgreSQL, a real downstream receiving what they deliver.

- sign in with a key typed into the form (the keyboard only), and watch the overview's counts
  move as updates arrive (its live part refreshes by itself);
- a downstream that refuses: find the exhaustions, dry-run a redrive, confirm the count, and
  see every one delivered once the downstream answers again;
- pause a bot, post updates, see none delivered and the page say paused; resume, and see them
  delivered in chat order;
- a viewer key finds no action, and a hand-made POST without the CSRF token is refused;
- every page at desktop width and at 400 px: nothing wider than the window, each screenshot
  saved under the test's directory (and, with CONSOLE_SCREENSHOTS=<dir>, there too: that is how
  docs/console/ is made).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from aiohttp import web
from playwright.async_api import Browser, Page, async_playwright, expect

from tests.downstream import FakeDownstream, eventually, message, ok, status
from tests.processes import SECRET, Process, environment, free_port, processes

pytestmark = pytest.mark.slow  # a browser and real processes

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
OPERATOR = "console-operator.key-0123456789"
VIEWER = "console-viewer.key-0123456789"
KEYS_TOML = f"""
[[api_keys]]
key = "{OPERATOR}"
name = "olga"
scopes = ["operator"]

[[api_keys]]
key = "{VIEWER}"
name = "vera"
scopes = ["viewer"]
"""
WEBHOOK = {"X-Telegram-Bot-Api-Secret-Token": SECRET, "Content-Type": "application/json"}
DESKTOP = {"width": 1280, "height": 900}
NARROW = {"width": 400, "height": 900}


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    where = await asyncio.to_thread(chromium)
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(args=FLAGS, **where)
        try:
            yield launched
        finally:
            await launched.close()


def chromium() -> dict[str, str]:
    """How to launch Chromium, never skipped: Debian's at /usr/bin/chromium (.ci/run installs
    it; under CI, one missing fails here); on a machine without it, outside CI, Playwright's
    own, downloaded once (`playwright install chromium`), as the test session starts its own
    PostgreSQL where none listens."""
    if Path(CHROMIUM).exists():
        return {"executable_path": CHROMIUM}
    assert os.environ.get("CI") != "true", f"{CHROMIUM} is missing: apt-get install -y chromium"
    subprocess.run([sys.executable, "-m", "playwright", "install", "chromium"], check=True)
    return {}


def keep(path: Path) -> None:
    """With CONSOLE_SCREENSHOTS=<dir>, a copy of the screenshot there too (docs/console/)."""
    wanted = os.environ.get("CONSOLE_SCREENSHOTS")
    if wanted:
        Path(wanted).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(wanted) / path.name)


def configured(tmp_path: Path, env: dict[str, str]) -> dict[str, str]:
    config = tmp_path / "intake.toml"
    config.write_text(KEYS_TOML)
    return {**env, "INTAKE_CONFIG": str(config), "INTAKE_POLL_INTERVAL_SECONDS": "5"}


async def sign_in(page: Page, base: str, key: str) -> None:
    await page.goto(f"{base}/console")
    await expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    await page.get_by_label("API key").focus()
    await page.keyboard.type(key)
    await page.keyboard.press("Enter")
    await expect(page.get_by_role("heading", name="Overview")).to_be_visible()


async def post(client: httpx.AsyncClient, base: str, update_id: int, chat: int) -> None:
    answer = await client.post(
        f"{base}/telegram/default", content=message(update_id, chat=chat), headers=WEBHOOK
    )
    assert answer.status_code == 200, answer.text


def cell(page: Page, state: str) -> object:
    return page.locator(f'section[aria-labelledby="bot-default"] td[data-state="{state}"]')


async def screenshot(page: Page, tmp_path: Path, name: str) -> None:
    """Both widths of the page now showing; nothing on it wider than the window."""
    for width, size in (("desktop", DESKTOP), ("narrow", NARROW)):
        await page.set_viewport_size(size)
        overflow = await page.evaluate(
            "document.documentElement.scrollWidth - document.documentElement.clientWidth"
        )
        assert overflow <= 0, f"{name} at {width} is {overflow} px wider than the window"
        path = tmp_path / "screenshots" / f"{name}-{width}.png"
        await page.screenshot(path=str(path), full_page=True)
        keep(path)
    await page.set_viewport_size(DESKTOP)


async def test_an_operator_s_incident_in_the_console_of_a_run_process(
    browser: Browser, sqlite_storage: object, downstream: FakeDownstream, tmp_path: Path
) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = configured(
        tmp_path,
        environment(sqlite_storage.url(), f"{downstream.url}/hook", port=port, max_attempts=1),
    )  # type: ignore[attr-defined]
    with processes(tmp_path) as start:
        run = start("run", env, "run")
        await eventually(lambda: run.answers(f"{base}/healthz"), within=30)
        page = await browser.new_page(viewport=DESKTOP)
        async with httpx.AsyncClient(timeout=10) as client:
            await screenshot_sign_in(page, base, tmp_path)
            await sign_in(page, base, OPERATOR)

            # The overview's counts move as updates arrive (its live part refreshes itself).
            await expect(cell(page, "completed")).to_have_text("0")
            for update_id in range(1, 4):
                await post(client, base, update_id, chat=100 + update_id)
            await expect(cell(page, "completed")).to_have_text("3", timeout=20_000)
            await screenshot(page, tmp_path, "overview")

            # A downstream that refuses: its updates become exhaustions.
            downstream.answer = status(400)
            for update_id in range(4, 7):
                await post(client, base, update_id, chat=200)
            await expect(cell(page, "open-exhaustions")).to_have_text("3", timeout=20_000)
            await page.get_by_role("link", name="Exhaustions").click()
            await page.get_by_label("Bot").select_option("default")
            await page.get_by_role("button", name="Dry run: redrive").click()
            await expect(
                page.get_by_role("heading", name="Confirm: redrive 3 exhaustions")
            ).to_be_visible()
            assert len(downstream.received) == 6  # 3 delivered, 3 refused: the dry run sent none
            await screenshot(page, tmp_path, "exhaustions")
            downstream.answer = ok  # the fix is deployed
            await page.get_by_role("button", name="Redrive 3 exhaustions").click()
            await expect(page.get_by_role("status").first).to_contain_text("Redrove 3 exhaustions")
            await eventually(lambda: len(downstream.received) == 9, within=20)
            redelivered = [r.update_id for r in downstream.received[6:]]
            assert redelivered == [4, 5, 6]  # one chat: in order

            # Pause: updates are recorded, none delivered, the pages say paused; resume.
            await page.get_by_role("link", name="Bots").click()
            await page.get_by_label("Reason for pausing default").fill("deploying the handler")
            await page.get_by_role("button", name="Pause default").click()
            await expect(
                page.get_by_role("cell", name="paused by olga (deploying the handler)")
            ).to_be_visible()
            await screenshot(page, tmp_path, "bots")
            for update_id, chat in ((7, 300), (8, 301), (9, 300), (10, 301)):
                await post(client, base, update_id, chat=chat)
            await page.get_by_role("link", name="Overview").click()
            await expect(page.locator("#bot-default")).to_contain_text("paused")
            await expect(cell(page, "pending")).to_have_text("4")
            assert len(downstream.received) == 9
            await page.get_by_role("link", name="Bots").click()
            await page.get_by_role("button", name="Resume default").click()
            await eventually(lambda: len(downstream.received) == 13, within=20)
            after = [r.update_id for r in downstream.received[9:]]
            assert [u for u in after if u in (7, 9)] == [7, 9]  # chat 300 in order
            assert [u for u in after if u in (8, 10)] == [8, 10]  # chat 301 in order

            # Search, one update's page, the audit log.
            await page.get_by_role("link", name="Updates").click()
            await page.get_by_label("Body contains").fill('"update_id": 5')
            await page.get_by_role("button", name="Search").click()
            await page.get_by_role("link", name="default 5").click()
            await expect(page.get_by_role("heading", name="Update 5 of default")).to_be_visible()
            await expect(page.get_by_text("Attempt 1: exhausted")).to_be_visible()
            await expect(page.get_by_text("Attempt 2: completed")).to_be_visible()
            await screenshot(page, tmp_path, "update")
            await page.get_by_role("link", name="Updates").click()
            await screenshot(page, tmp_path, "updates")
            await page.get_by_role("link", name="Audit log").click()
            await expect(page.get_by_role("row", name="olga").first).to_be_visible()
            await screenshot(page, tmp_path, "audit")

            # A viewer sees and cannot act; a POST made by hand without the token is refused.
            await page.get_by_role("button", name="Sign out").click()
            await sign_in(page, base, VIEWER)
            for path in ("/console/bots", "/console/exhaustions?preview=redrive"):
                await page.goto(f"{base}{path}")
                buttons = [await b.inner_text() for b in await page.get_by_role("button").all()]
                assert sorted(buttons) in (["Sign out"], ["Filter", "Sign out"]), buttons
            forged = await page.request.post(
                f"{base}/console/bots/default/pause", form={"reason": "forged"}
            )
            assert forged.status == 403
            assert (await client.get(f"{base}/healthz")).status_code == 200

            # Another site's page that posts a valid key to the sign-in form signs nobody in.
            await cross_site_sign_in_is_refused(browser, base)
        await page.close()
    assert_no_key_logged(run)


async def cross_site_sign_in_is_refused(browser: Browser, base: str) -> None:
    """A page of another site (localhost, another port) whose form posts a valid key to the
    console's sign-in, submitted by script as the page loads."""
    form = (
        f'<form id="f" method="post" action="{base}/console/sign-in">'
        f'<input name="key" value="{OPERATOR}"></form>'
        '<script>document.getElementById("f").submit()</script>'
    )

    async def evil(_request: web.Request) -> web.Response:
        return web.Response(text=form, content_type="text/html")

    site = web.Application()
    site.router.add_get("/", evil)
    runner = web.AppRunner(site)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    visitor = await browser.new_context()
    try:
        page = await visitor.new_page()
        await page.goto(f"http://localhost:{port}/")
        await expect(page.get_by_role("alert")).to_contain_text("another site")
        assert page.url == f"{base}/console/sign-in"
        assert not [c for c in await visitor.cookies() if c["name"] == "intake_console"]
        await page.goto(f"{base}/console")
        await expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    finally:
        await visitor.close()
        await runner.cleanup()


async def screenshot_sign_in(page: Page, base: str, tmp_path: Path) -> None:
    await page.goto(f"{base}/console/sign-in")
    await screenshot(page, tmp_path, "sign-in")


def assert_no_key_logged(*children: Process) -> None:
    for child in children:
        logs = child.stdout + child.stderr
        assert OPERATOR not in logs
        assert VIEWER not in logs


async def test_a_pause_in_the_console_of_serve_holds_a_worker_on_postgresql(
    browser: Browser, postgres_storage: object, downstream: FakeDownstream, tmp_path: Path
) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = configured(
        tmp_path, environment(postgres_storage.url(), f"{downstream.url}/hook", port=port)
    )  # type: ignore[attr-defined]
    with processes(tmp_path) as start:
        serve = start("serve", env, "serve")
        worker = start("worker", env, "worker")
        await eventually(lambda: serve.answers(f"{base}/healthz"), within=30)
        await eventually(worker.started, within=30)
        page = await browser.new_page(viewport=DESKTOP)
        async with httpx.AsyncClient(timeout=10) as client:
            await sign_in(page, base, OPERATOR)
            await page.get_by_role("link", name="Bots").click()
            await page.get_by_role("button", name="Pause default").click()
            await expect(page.get_by_role("button", name="Resume default")).to_be_visible()
            for update_id, chat in ((1, 7), (2, 8), (3, 7)):
                await post(client, base, update_id, chat=chat)
            await page.get_by_role("link", name="Overview").click()
            await expect(cell(page, "pending")).to_have_text("3")
            assert downstream.received == []
            await page.get_by_role("link", name="Bots").click()
            await page.get_by_role("button", name="Resume default").click()
            await eventually(lambda: len(downstream.received) == 3, within=20)
            delivered = [r.update_id for r in downstream.received]
            assert [u for u in delivered if u in (1, 3)] == [1, 3]
        await page.close()
    assert_no_key_logged(serve, worker)
