"""Tracing end to end (docs/contract.md section 15): `serve` and a `worker` as processes,
turned on by the standard environment alone, exporting over OTLP/HTTP to a receiver this test
runs, which decodes what arrives with OpenTelemetry's own protobuf definitions; then a bot of
each framework on the kit's adapter (aiogram and python-telegram-bot in tests/kit/bots, grammY
and Telegraf in kit/typescript/test/bots), tracing with an SDK of its own into the same
receiver, its handler's span in the update's trace."""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
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

from app.fake_bot_api import FakeBotApi
from tests.conftest import Storage, serve_asgi
from tests.downstream import FakeDownstream, by_attempt, eventually, message, ok, status
from tests.kit.bots import bot_program
from tests.processes import (
    ROOT,
    SECRET,
    STARTUP,
    environment,
    free_port,
    post_update,
    processes,
    until_listening,
    until_serving,
)

BOT_SECRET = "bot-downstream-secret"


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
                    # The service's processes by their role, any other by its name.
                    role = str(
                        resource.get("service.instance.role") or resource.get("service.name")
                    )
                    for scope_spans in resource_spans.scope_spans:
                        for span in scope_spans.spans:
                            self.spans.append((role, span))
                            self.values += [str(v) for v in _attributes(span.attributes).values()]
            answer = ExportTraceServiceResponse().SerializeToString()
            return Response(answer, media_type="application/x-protobuf")

        return Starlette(routes=[Route("/v1/traces", traces, methods=["POST"])])

    def named(self, name: str) -> list[tuple[str, Span]]:
        with self._lock:
            return [(role, span) for role, span in self.spans if span.name == name]

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


async def test_spans_waiting_for_their_batch_are_exported_at_a_graceful_stop(
    storage: Storage, downstream: FakeDownstream, tmp_path: Path
) -> None:
    # With batches due only every ten minutes, nothing is exported while the processes run:
    # every span arrives because SIGTERM's graceful stop exports what waits (uvicorn ends
    # `serve` by raising the signal again, past the SDK's own exit hook).
    receiver = Receiver()
    port = free_port()
    async with serve_asgi(receiver.app()) as collector:
        env = environment(storage.url(), f"{downstream.url}/hook") | {
            "OTEL_EXPORTER_OTLP_ENDPOINT": collector,
            "OTEL_BSP_SCHEDULE_DELAY": "600000",
        }
        with processes(tmp_path) as start:
            serve = start("serve", env, "serve", "--port", str(port))
            worker = start("worker", env, "worker")
            async with httpx.AsyncClient() as client:
                await until_serving(client, port, serve)
                await post_update(client, port, message(3))
            await eventually(lambda: downstream.received, within=STARTUP)
            assert receiver.spans == []  # all of them still waiting for their batch
            for process in (serve, worker):
                process.signal(signal.SIGTERM)
            await eventually(lambda: serve.poll() is not None and worker.poll() is not None)
    names = sorted((role, span.name) for role, span in receiver.spans)
    assert names == [
        ("serve", "POST /telegram/{bot}"),
        ("worker", "POST"),
        ("worker", "claim"),
        ("worker", "process default"),
        ("worker", "settle completed"),
    ]


@pytest.mark.parametrize("framework", ["aiogram", "ptb", "grammy", "telegraf"])
async def test_the_bot_s_own_spans_join_the_update_s_trace_under_the_forward(
    postgres_storage: Storage, tmp_path: Path, framework: str
) -> None:
    # The bot runs on the kit's adapter with OpenTelemetry's SDK of its own, exporting to the
    # same receiver as the service: its handler's span is the forward's child.
    receiver = Receiver()
    bot_api = FakeBotApi()
    url = postgres_storage.url()
    port, bot_port = free_port(), free_port()
    async with serve_asgi(receiver.app()) as collector, serve_asgi(bot_api.app()) as api_root:
        exporting = {"OTEL_EXPORTER_OTLP_ENDPOINT": collector, "OTEL_BSP_SCHEDULE_DELAY": "100"}
        bot_env = (
            environment("unused", None)
            | exporting
            | {
                "PYTHONPATH": str(ROOT),
                "OTEL_SERVICE_NAME": "shop-bot",
                "BOT_TOKEN": bot_api.token,
                "BOT_API_ROOT": api_root,
                "PORT": str(bot_port),
                "SECRET_TOKEN": BOT_SECRET,
            }
        )
        env = exporting | environment(
            url,
            f"http://127.0.0.1:{bot_port}/",
            downstream_secret_token=BOT_SECRET,
        )
        with processes(tmp_path) as start:
            bot = start("bot", bot_env, program=bot_program(framework))
            until_listening(bot_port, bot)
            serve = start("serve", env, "serve", "--port", str(port))
            start("worker", env, "worker")
            async with httpx.AsyncClient() as client:
                await until_serving(client, port, serve)
                await post_update(client, port, message(9, text="pay 42"))
            await eventually(lambda: bot_api.sent(), within=STARTUP)
            await eventually(lambda: receiver.named("handle message"))
            await eventually(lambda: receiver.of_kind(Span.SPAN_KIND_CLIENT))
            await eventually(lambda: receiver.of_kind(Span.SPAN_KIND_SERVER))

    [(role, intake)] = receiver.of_kind(Span.SPAN_KIND_SERVER)
    assert role == "serve"
    [(role, forward)] = receiver.of_kind(Span.SPAN_KIND_CLIENT)
    assert role == "worker"
    [(role, handled)] = receiver.named("handle message")
    assert role == "shop-bot"  # the bot's own process and SDK
    assert handled.trace_id == intake.trace_id  # one trace, from Telegram's post to the bot
    assert handled.parent_span_id == forward.span_id
    assert _attributes(handled.attributes)["bot.update_id"] == 9
    assert [json.loads(call["text"])["update_id"] for call in bot_api.sent()] == [9]
    for secret in ("pay 42", SECRET, BOT_SECRET):
        assert not [value for value in receiver.values if secret in value]
