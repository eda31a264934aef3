"""docs/design.md decision 3 end to end: a downstream that pauses past its lease finds, when it
wakes, that a rival worker has reclaimed its update; `owns` says so, and its domain write is
refused. The first worker is a real `telegram-intake worker` process, frozen with SIGSTOP
(as a long GC pause or a stalled VM freezes one): it stops renewing, its lease lapses, and
the rival (the service's own workers, in this process) takes the update over.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from pathlib import Path

import pytest
from pydantic import SecretStr
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from app.api_keys import ApiKey
from app.bot_settings import BotSettings
from app.config import Settings
from app.main import create_app
from app.store import open_store
from telegram_intake_kit import IntakeClient, read_forwarded
from tests.conftest import Storage, serve_asgi
from tests.downstream import SIGNING_SECRET, eventually, message, now_ms
from tests.processes import SECRET, environment, processes

pytestmark = pytest.mark.slow

KEY = "reclaim-test.callback-key"


class PausingDownstream:
    """Attempt 1 waits for `release` before it checks ownership; later attempts go at once.
    Each attempt records what `owns` answered and whether it wrote its effect."""

    def __init__(self) -> None:
        self.intake_url = ""  # the service's, once it runs
        self.release = threading.Event()
        self.arrived: list[int] = []
        self.owned: dict[int, bool] = {}
        self.effects: dict[int, int] = {}  # update_id -> the attempt that wrote it
        self._lock = threading.Lock()

    def app(self) -> Starlette:
        async def handle(request: Request) -> JSONResponse:
            forwarded = read_forwarded(
                request.headers, await request.body(), signing_secret=SIGNING_SECRET
            )
            identity = forwarded.identity
            assert identity is not None
            self.arrived.append(identity.attempt)
            if identity.attempt == 1:
                await asyncio.to_thread(self.release.wait, 60)
            async with IntakeClient(self.intake_url, KEY) as intake:
                owned = (await intake.owns(identity)).owned
            with self._lock:
                self.owned[identity.attempt] = owned
                if owned:  # the domain write, keyed by the update
                    self.effects.setdefault(identity.update_id, identity.attempt)
            return JSONResponse({} if owned else {"error": "not the owner"}, 200 if owned else 409)

        return Starlette(routes=[Route("/", handle, methods=["POST"])])


async def test_a_downstream_paused_past_its_lease_is_refused_after_a_rival_reclaims(
    postgres_storage: Storage, tmp_path: Path
) -> None:
    url = postgres_storage.url()
    downstream = PausingDownstream()
    async with serve_asgi(downstream.app()) as downstream_url:
        env = environment(url, f"{downstream_url}/", lease_seconds=1, signing_secret=SIGNING_SECRET)
        store = await open_store(url)
        with processes(tmp_path) as start:
            first = start("worker", env, "worker")
            await eventually(first.started, within=30)
            await store.add("default", 7, message(7), now_ms(), queue_key="chat:42")
            await eventually(lambda: downstream.arrived == [1])
            first.signal(signal.SIGSTOP)  # frozen mid-forward: no renewals from here on
            try:
                bot = BotSettings(
                    name="default",
                    secret_token=SecretStr(SECRET),
                    downstream_url=f"{downstream_url}/",  # type: ignore[arg-type]
                    signing_secret=SecretStr(SIGNING_SECRET),
                    lease_seconds=5,
                )
                settings = Settings(
                    database_url=url,
                    bots=(bot,),
                    api_keys=(ApiKey(key=SecretStr(KEY), scopes=("callback",)),),
                    poll_interval_seconds=0.2,
                )
                async with serve_asgi(create_app(settings, workers=True)) as service:
                    downstream.intake_url = service
                    # The rival reclaims once the frozen worker's lease has lapsed.
                    await eventually(lambda: downstream.effects == {7: 2}, within=20)

                    async def completed_by_the_rival() -> bool:
                        # The effect is written before the answer that the rival then settles.
                        row = await store.get_update("default", 7)
                        return row is not None and (row.state, row.attempts) == ("completed", 2)

                    await eventually(completed_by_the_rival)
                    downstream.release.set()  # attempt 1 wakes up and checks
                    await eventually(lambda: 1 in downstream.owned)
                    assert downstream.owned == {1: False, 2: True}
                    assert downstream.effects == {7: 2}  # attempt 1 wrote nothing
            finally:
                first.signal(signal.SIGCONT)
            # The first worker thaws, finds its lease gone, and changes nothing.
            await asyncio.sleep(2)
            row = await store.get_update("default", 7)
            assert row is not None
            assert (row.state, row.attempts) == ("completed", 2)
            assert downstream.arrived == [1, 2]
        await store.close()
