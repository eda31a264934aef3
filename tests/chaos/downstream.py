"""The chaos run's downstream: a bot handler that fails, hangs and refuses on purpose, and writes
its one effect per update fenced, in the service's own database.

Run as its own process: `python -m tests.chaos.downstream PORT DATABASE_URL JOURNAL HANG [HOST]`.

For each forwarded attempt, decided by the attempt's own (destination, update_id, attempt) so
that reruns behave alike (each destination of a bot fails and hangs on its own draws):
- an update in the rejected set (`rejected`) answers 400, which exhausts it;
- 10% answer 500, which retries it;
- 5% hang past the worker's forward timeout, then try their write anyway, as a slow handler
  whose client gave up would: the attempt is stale by then and its owns check must refuse it;
- the rest write the effect in one transaction with `telegram_intake_owns` (docs/design.md decision
  3; its five-argument form, with the destination from `X-Intake-Destination`): written only
  while the attempt owns the delivery, once per delivery; 200 when it owns the delivery (written
  now or before), 409 when it does not, 503 when the database is away.

Every request is appended to the journal (JSON lines, in arrival order, each with the time)
when it arrives and again with its answer, a hanging one also when its client gives up on it
(`disconnected`), and every exhaustion record delivered to `/exhausted` likewise; the run
checks the journal against the database at the end.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, TextIO

import psycopg
import uvicorn
from psycopg_pool import AsyncConnectionPool
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

FAIL_RATE = 0.10
HANG_RATE = 0.05
REJECT_EVERY = 97
EFFECTS = """
CREATE TABLE IF NOT EXISTS chaos_effects (
    bot text NOT NULL,
    destination text NOT NULL,
    update_id bigint NOT NULL,
    attempt integer NOT NULL,
    claim_id text NOT NULL,
    PRIMARY KEY (bot, destination, update_id)
)
"""


def rejected(update_id: int) -> bool:
    """The fixed set of updates the downstream refuses with a 4xx."""
    return update_id % REJECT_EVERY == 0


def fate(destination: str, update_id: int, attempt: int) -> str:
    """What the downstream does with this attempt of this delivery: the same every run."""
    if rejected(update_id):
        return "reject"
    seed = f"{update_id}:{attempt}"
    if destination != "default":
        seed = f"{destination}:{seed}"
    draw = random.Random(seed).random()
    if draw < FAIL_RATE:
        return "fail"
    if draw < FAIL_RATE + HANG_RATE:
        return "hang"
    return "write"


class Downstream:
    def __init__(self, database_url: str, journal: TextIO, hang_seconds: float) -> None:
        self._pool = AsyncConnectionPool(
            database_url,
            min_size=2,
            max_size=20,
            open=False,
            check=AsyncConnectionPool.check_connection,
            # Nothing prepared: the same behind PgBouncer's transaction pooling (a prepared
            # statement would outlive its transaction there) as direct.
            kwargs={"autocommit": False, "connect_timeout": 3, "prepare_threshold": None},
        )
        self._journal = journal
        self._hang = hang_seconds

    def record(self, **entry: Any) -> None:
        entry["at"] = time.time()  # beside the run's own clock: the same machine's
        self._journal.write(json.dumps(entry) + "\n")
        self._journal.flush()

    @asynccontextmanager
    async def lifespan(self, _app: Starlette) -> AsyncIterator[None]:
        await self._pool.open(wait=False)
        try:
            yield
        finally:
            await self._pool.close()

    async def hook(self, request: Request) -> JSONResponse:
        body = await request.body()
        update = json.loads(body)
        identity = {
            "bot": request.headers["x-intake-bot"],
            "destination": request.headers.get("x-intake-destination", "default"),
            "update_id": int(request.headers["x-intake-update-id"]),
            "attempt": int(request.headers["x-intake-attempt"]),
            "claim_id": request.headers["x-intake-claim-id"],
        }
        chat = update["message"]["chat"]["id"]
        self.record(event="arrived", chat=chat, **identity)
        status, owned = await self._handle(identity, request)
        self.record(event="answered", status=status, owned=owned, **identity)
        return JSONResponse({"owned": owned}, status)

    async def _handle(self, identity: dict[str, Any], request: Request) -> tuple[int, bool | None]:
        what = fate(identity["destination"], identity["update_id"], identity["attempt"])
        if what == "reject":
            return 400, None
        if what == "fail":
            return 500, None
        if what == "hang":
            await self._hold(identity, request)
        try:
            owned = await self._write(identity)
        except (psycopg.Error, OSError, TimeoutError):
            return 503, None
        return (200 if owned else 409), owned

    async def _hold(self, identity: dict[str, Any], request: Request) -> None:
        """Hang for the hang time, noting when the worker gives up on the request."""
        deadline = time.monotonic() + self._hang
        noticed = False
        while (left := deadline - time.monotonic()) > 0:
            await asyncio.sleep(min(0.02, left))
            if not noticed and await request.is_disconnected():
                noticed = True
                self.record(event="disconnected", **identity)

    async def _write(self, identity: dict[str, Any]) -> bool:
        async with self._pool.connection(timeout=5) as connection, connection.transaction():
            cursor = await connection.execute(
                "SELECT telegram_intake_owns(%(bot)s, %(destination)s, %(update_id)s, "
                "%(attempt)s, %(claim_id)s)",
                identity,
            )
            row = await cursor.fetchone()
            if row is None or not row[0]:
                return False
            await connection.execute(
                "INSERT INTO chaos_effects (bot, destination, update_id, attempt, claim_id) "
                "VALUES (%(bot)s, %(destination)s, %(update_id)s, %(attempt)s, %(claim_id)s) "
                "ON CONFLICT (bot, destination, update_id) DO NOTHING",
                identity,
            )
            return True

    async def exhausted(self, request: Request) -> JSONResponse:
        record = await request.json()
        fields = ("bot", "update_id", "attempt", "claim_id", "error")
        destination = record.get("destination", "default")  # named beside `default` only
        self.record(
            event="exhaustion", destination=destination, **{name: record[name] for name in fields}
        )
        return JSONResponse({})


def main() -> None:
    port, database_url, journal_path, hang_seconds = sys.argv[1:5]
    host = sys.argv[5] if len(sys.argv) > 5 else "127.0.0.1"
    with open(journal_path, "a", encoding="utf-8") as journal:
        downstream = Downstream(database_url, journal, float(hang_seconds))
        app = Starlette(
            routes=[
                Route("/hook", downstream.hook, methods=["POST"]),
                Route("/exhausted", downstream.exhausted, methods=["POST"]),
            ],
            lifespan=downstream.lifespan,
        )
        uvicorn.run(app, host=host, port=int(port), log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
