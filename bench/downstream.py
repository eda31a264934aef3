"""The benchmarks' downstream: an aiohttp server, in its own process, that answers every
forwarded update at once.

    python -m bench.downstream PORT [--owns INTAKE KEY] [--forget]

With `--owns`, it first asks `POST INTAKE/v1/claims/owns` with the attempt's identity, as the
README tells a downstream to, and answers 409 when the attempt is not owned. It keeps each
update's arrival time (`GET /times`, by update_id) unless told to `--forget` (a soak: memory
must stay flat), and, either way, the count of updates seen (`GET /count`: distinct ones, or
every arrival when it forgets) and the latencies
from the intake's `X-Intake-Received-At` to arrival since the last `GET /sample`, which
answers them and starts a new window. `POST /reset` forgets everything. Prints `ready` when
it listens.
"""

from __future__ import annotations

import argparse
import sys
import time

from aiohttp import ClientSession, TCPConnector, web
from multidict import CIMultiDictProxy

# The kit's RECEIVED_AT_HEADER (telegram_intake_kit.forwarded), not imported: the kit brings
# pydantic and httpx, and this process stands for a downstream of its own, as light as can be.
RECEIVED_AT_HEADER = "x-intake-received-at"


class Downstream:
    def __init__(self, owns: tuple[str, str] | None, forget: bool) -> None:
        self._owns = owns
        self._forget = forget
        self._session: ClientSession | None = None
        self.seen: dict[str, float] = {}
        self.count = 0
        self.window: list[float] = []  # ms from received to arrival, since the last sample

    async def hook(self, request: web.Request) -> web.Response:
        await request.read()
        headers = request.headers
        # PgQueuer's worker (bench dispatch) sends its job's id as X-Update-Id.
        update_id = headers.get("x-intake-update-id") or headers["x-update-id"]
        if self._owns is not None and not await self._owned(headers):
            return web.Response(status=409, text="{}")
        arrived = time.time()
        if self._forget or self.seen.setdefault(update_id, arrived) == arrived:
            self.count += 1
        if RECEIVED_AT_HEADER in headers:
            self.window.append(arrived * 1000 - int(headers[RECEIVED_AT_HEADER]))
        return web.Response(text="{}")

    async def _owned(self, headers: CIMultiDictProxy[str]) -> bool:
        assert self._owns is not None
        intake, key = self._owns
        if self._session is None:
            self._session = ClientSession(connector=TCPConnector(limit=64))
        identity = {
            "bot": headers["x-intake-bot"],
            "update_id": int(headers["x-intake-update-id"]),
            "attempt": int(headers["x-intake-attempt"]),
            "claim_id": headers["x-intake-claim-id"],
        }
        async with self._session.post(
            f"{intake}/v1/claims/owns", json=identity, headers={"authorization": f"Bearer {key}"}
        ) as answer:
            owned: bool = (await answer.json())["owned"]
            return owned

    async def counted(self, _request: web.Request) -> web.Response:
        return web.json_response({"count": self.count})

    async def times(self, _request: web.Request) -> web.Response:
        return web.json_response(self.seen)

    async def sample(self, _request: web.Request) -> web.Response:
        window, self.window = self.window, []
        return web.json_response({"count": self.count, "latencies_ms": window})

    async def reset(self, _request: web.Request) -> web.Response:
        self.seen.clear()
        self.window.clear()
        self.count = 0
        return web.json_response({})


def command(port: int, *, owns: tuple[str, str] | None = None, forget: bool = False) -> list[str]:
    """The command that runs this downstream on `port`."""
    return [
        sys.executable, "-m", "bench.downstream", str(port),
        *(("--owns", *owns) if owns else ()), *(("--forget",) if forget else ()),
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("port", type=int)
    parser.add_argument("--owns", nargs=2, metavar=("INTAKE", "KEY"))
    parser.add_argument("--forget", action="store_true")
    args = parser.parse_args()
    downstream = Downstream(tuple(args.owns) if args.owns else None, args.forget)
    app = web.Application()
    app.router.add_post("/hook", downstream.hook)
    app.router.add_get("/count", downstream.counted)
    app.router.add_get("/times", downstream.times)
    app.router.add_get("/sample", downstream.sample)
    app.router.add_post("/reset", downstream.reset)
    # run_app prints its address once it listens: say `ready` then instead.
    ready = lambda _address: print("ready", flush=True)  # noqa: E731
    web.run_app(app, host="127.0.0.1", port=args.port, print=ready, access_log=None)


if __name__ == "__main__":
    main()
