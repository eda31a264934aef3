"""The benchmarks' trace collector: an aiohttp server, in its own process, taking OTLP/HTTP
exports as a collector would, and keeping them aside.

    python -m bench.otlp_sink PORT

`POST /v1/traces` answers 200 at once and keeps the body; decoding waits for `GET /count`,
which answers the spans received so far (`{"spans": n, "exports": n, "names": {name: n}}`),
so that a collector's work does not take the measured servers' cores while they run.
`POST /reset` forgets everything. Prints `ready` when it listens.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter

from aiohttp import ClientSession, web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

ANSWER = ExportTraceServiceResponse().SerializeToString()


class Sink:
    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def export(self, request: web.Request) -> web.Response:
        self.bodies.append(await request.read())
        return web.Response(body=ANSWER, content_type="application/x-protobuf")

    async def count(self, _request: web.Request) -> web.Response:
        names: Counter[str] = Counter()
        for body in self.bodies:
            exported = ExportTraceServiceRequest.FromString(body)
            for resource in exported.resource_spans:
                for scope in resource.scope_spans:
                    names.update(span.name for span in scope.spans)
        answer = {"spans": names.total(), "exports": len(self.bodies), "names": names}
        return web.json_response(answer)

    async def reset(self, _request: web.Request) -> web.Response:
        self.bodies.clear()
        return web.json_response({})


async def exported_spans(sink: str) -> int:
    """The spans the collector at `sink` received since its last reset; then it is reset."""
    async with ClientSession() as session:
        async with session.get(f"{sink}/count") as answer:
            spans = int((await answer.json())["spans"])
        async with session.post(f"{sink}/reset"):
            return spans


def command(port: int) -> tuple[str, ...]:
    return (sys.executable, "-m", "bench.otlp_sink", str(port))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.otlp_sink")
    parser.add_argument("port", type=int)
    args = parser.parse_args()
    sink = Sink()
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/traces", sink.export)
    app.router.add_get("/count", sink.count)
    app.router.add_post("/reset", sink.reset)
    web.run_app(app, host="127.0.0.1", port=args.port, print=lambda _: print("ready", flush=True))


if __name__ == "__main__":
    main()
