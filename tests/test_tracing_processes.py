"""Tracing end to end (docs/contract.md section 15): `serve` and a `worker` as processes,
turned on by the standard environment alone, exporting over OTLP/HTTP to a receiver this test
runs, which decodes what arrives with OpenTelemetry's own protobuf definitions."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.conftest import Storage, serve_asgi
from tests.downstream import FakeDownstream, by_attempt, eventually, message, ok, status
from tests.processes import (
    SECRET,
    STARTUP,
    environment,
    free_port,
    post_update,
    processes,
    until_serving,
)


class Receiver:
    """An OTLP/HTTP trace receiver: every span exported to it, with its process's role."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.spans: list[tuple[str, Span]] = []
        self.values: list[str] = []  # every attribute value, resource ones too, as text

    def app(self) -> Starlette:
        async def traces(request: Request) -> Response:
            exported = ExportTraceServiceRequest.FromString(await request.body())
            with self._lock:
                for resource_spans in exported.resource_spans:
                    resource = _attributes(resource_spans.resource.attributes)
                    self.values += [str(v) for v in resource.values()]
                    for scope_spans in resource_spans.scope_spans:
                        for span in scope_spans.spans:
                            role = str(resource.get("service.instance.role"))
                            self.spans.append((role, span))
                            self.values += [str(v) for v in _attributes(span.attributes).values()]
            answer = ExportTraceServiceResponse().SerializeToString()
            return Response(answer, media_type="application/x-protobuf")

        return Starlette(routes=[Route("/v1/traces", traces, methods=["POST"])])

    def of_kind(self, kind: int) -> list[tuple[str, Span]]:
        with self._lock:
            return [(role, span) for role, span in self.spans if span.kind == kind]


def _attributes(pairs: Any) -> dict[str, Any]:
    values: dict[str, Any] = {}
    pair: KeyValue
    for pair in pairs:
        which = pair.value.WhichOneof("value")
        values[pair.key] = getattr(pair.value, which) if which else None
    return values


async def test_one_trace_from_serve_through_a_worker_s_two_attempts_to_the_bot(
    storage: Storage, downstream: FakeDownstream, tmp_path: Path
) -> None:
    receiver = Receiver()
    downstream.answer = by_attempt(status(500), ok)
    url = storage.url()
    port = free_port()
    async with serve_asgi(receiver.app()) as collector:
        env = environment(url, f"{downstream.url}/hook") | {
            "OTEL_EXPORTER_OTLP_ENDPOINT": collector,
            "OTEL_SERVICE_NAME": "intake-under-test",
            "OTEL_BSP_SCHEDULE_DELAY": "100",  # milliseconds between batches
        }
        with processes(tmp_path) as start:
            serve = start("serve", env, "serve", "--port", str(port))
            start("worker", env, "worker")
            async with httpx.AsyncClient() as client:
                await until_serving(client, port, serve)
                await post_update(client, port, message(5, text="pay 42"))
            await eventually(lambda: len(downstream.received) == 2, within=STARTUP)
            await eventually(lambda: len(receiver.of_kind(Span.SPAN_KIND_CONSUMER)) == 2)
            await eventually(lambda: len(receiver.of_kind(Span.SPAN_KIND_CLIENT)) == 2)
            await eventually(lambda: receiver.of_kind(Span.SPAN_KIND_SERVER))

    [(role, intake)] = receiver.of_kind(Span.SPAN_KIND_SERVER)  # /healthz makes none
    assert (role, intake.name) == ("serve", "POST /telegram/{bot}")
    assert intake.parent_span_id == b""
    attempts = sorted(
        receiver.of_kind(Span.SPAN_KIND_CONSUMER),
        key=lambda each: _attributes(each[1].attributes)["intake.attempt"],
    )
    forwards = [span for _, span in receiver.of_kind(Span.SPAN_KIND_CLIENT)]
    received = downstream.received
    for number, (role, attempt) in enumerate(attempts, 1):
        attributes = _attributes(attempt.attributes)
        assert role == "worker"  # another process, the same trace
        assert attempt.trace_id == intake.trace_id
        assert attempt.parent_span_id == intake.span_id
        assert attributes["intake.outcome"] == ("retry", "completed")[number - 1]
        assert attributes["intake.claim_id"] == received[number - 1].headers["x-intake-claim-id"]
        [forward] = [span for span in forwards if span.parent_span_id == attempt.span_id]
        assert forward.trace_id == intake.trace_id
        # The downstream was handed the forward's span: the bot's spans join the trace there.
        traceparent = received[number - 1].headers["traceparent"]
        assert traceparent.split("-")[1:3] == [intake.trace_id.hex(), forward.span_id.hex()]
    for secret in ("pay 42", SECRET):  # never a body, a token or a secret
        assert not [value for value in receiver.values if secret in value]
