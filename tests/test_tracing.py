"""Tracing (app/tracing.py, docs/contract.md section 15): when the environment turns it on, what it
refuses, and the intake's span for each request, exported to an in-memory exporter from a
real uvicorn server over fresh storage of each backend."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from app import logs, tracing
from app.main import create_app
from tests.conftest import Storage, serve_asgi, table_rows
from tests.downstream import (
    DOWNSTREAM_SECRET,
    SIGNING_SECRET,
    FakeDownstream,
    bot,
    by_attempt,
    dispatching,
    eventually,
    message,
    ok,
    settings_for,
    status,
)
from tests.downstream import SECRET as DOWNSTREAM_MODULE_SECRET
from tests.intake.conftest import SECRET, intake_on

ENDPOINT = "http://127.0.0.1:4318"


@pytest.mark.parametrize(
    ("environ", "wanted"),
    [
        ({}, False),
        ({"OTEL_SERVICE_NAME": "shop-intake"}, False),  # a name alone exports nowhere
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{ENDPOINT}/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),  # the SDK's default endpoint, localhost
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_SDK_DISABLED": "TRUE"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": " "}, False),
    ],
)
def test_the_standard_environment_turns_tracing_on(environ: dict[str, str], wanted: bool) -> None:
    assert tracing.tracing_wanted(environ) is wanted


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER=zipkin"),
        ({"OTEL_TRACES_EXPORTER": "otlp,console"}, "OTEL_TRACES_EXPORTER=otlp,console"),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
            "OTEL_EXPORTER_OTLP_PROTOCOL=grpc",
        ),
        (
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"},
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/json",
        ),
    ],
)
def test_what_is_not_shipped_is_refused_by_name(environ: dict[str, str], named: str) -> None:
    with pytest.raises(tracing.TracingMisconfigured, match=named):
        tracing.start_tracing("serve", environ)
    assert tracing.tracer() is None


def test_serve_stops_at_start_up_on_an_exporter_it_does_not_ship(storage: Storage) -> None:
    environ = {
        "PATH": "/usr/bin:/bin",
        "INTAKE_DATABASE_URL": storage.url(),
        "INTAKE_SECRET_TOKEN": SECRET,
        "OTEL_TRACES_EXPORTER": "jaeger",
    }
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "serve", "--port", "0"],
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "tracing: OTEL_TRACES_EXPORTER=jaeger" in done.stderr


@pytest.fixture
def exported() -> Iterator[InMemorySpanExporter]:
    """Tracing on for this test, every span ended kept in memory; off again after it."""
    exporter = InMemorySpanExporter()
    tracing.start_tracing("serve", processor=SimpleSpanProcessor(exporter))
    try:
        yield exporter
    finally:
        tracing.stop_tracing()


UPDATE = (
    '{"update_id":%d,"message":{"message_id":1,"chat":{"id":7,"type":"private"},"text":"pay 42"}}'
)


async def _intake_spans(exporter: InMemorySpanExporter, count: int) -> list[ReadableSpan]:
    """The intake's spans, once there are `count`: the server ends a span after its answer
    has gone, so the client may read the answer first."""
    deadline = time.monotonic() + 10
    while True:
        spans = [s for s in exporter.get_finished_spans() if s.name.startswith("POST ")]
        if len(spans) >= count or time.monotonic() > deadline:
            return spans
        await asyncio.sleep(0.01)


def _values(span: ReadableSpan) -> str:
    return json.dumps(dict(span.attributes or {}), default=str)


async def test_each_recorded_update_begins_its_trace_at_the_intake(
    storage: Storage, exported: InMemorySpanExporter
) -> None:
    headers = {"X-Telegram-Bot-Api-Secret-Token": SECRET}
    async with intake_on(storage)() as (base, url), httpx.AsyncClient(base_url=base) as client:
        assert (
            await client.post("/telegram/shop", content=UPDATE % 5, headers=headers)
        ).status_code == 200
        [span] = await _intake_spans(exported, 1)
        assert span.name == "POST /telegram/{bot}"
        assert span.kind is SpanKind.SERVER
        assert span.parent is None  # Telegram sends no trace context: the update's trace starts
        attributes: dict[str, Any] = dict(span.attributes or {})
        assert attributes == {
            "http.request.method": "POST",
            "http.route": "/telegram/{bot}",
            "url.path": "/telegram/shop",
            "url.scheme": "http",
            "intake.bot": "shop",
            "intake.update_id": 5,
            "http.response.status_code": 200,
            "intake.outcome": "accepted",
        }
        assert span.status.status_code is StatusCode.UNSET
        assert span.start_time is not None
        assert span.end_time is not None
        assert span.start_time <= span.end_time
        # The row keeps the span's traceparent, for the attempts to join the update's trace.
        context = span.get_span_context()
        traceparent = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
        assert table_rows(url, "update_id", "trace_context") == [(5, traceparent)]

        # A duplicate and a wrong secret make no trace; a body that is no update gets its own,
        # a 400 (no update: nothing of it is kept).
        assert (
            await client.post("/telegram/shop", content=UPDATE % 5, headers=headers)
        ).status_code == 200
        wrong = {"X-Telegram-Bot-Api-Secret-Token": "not-it"}
        assert (
            await client.post("/telegram/shop", content=UPDATE % 6, headers=wrong)
        ).status_code == 403
        assert (
            await client.post("/telegram/nobody", content=UPDATE % 6, headers=headers)
        ).status_code == 403
        assert (
            await client.post("/telegram/shop", content="[1]", headers=headers)
        ).status_code == 400
        spans = await _intake_spans(exported, 2)
        assert len(spans) == 2
        refused = spans[1]
        assert refused.attributes is not None
        assert refused.attributes["http.response.status_code"] == 400
        assert refused.attributes["intake.outcome"] == "invalid"
        assert "intake.update_id" not in refused.attributes
        assert refused.context is not None
        assert span.context is not None
        assert refused.context.trace_id != span.context.trace_id

    for each in exported.get_finished_spans():  # never a body, a token or a secret
        assert "pay 42" not in _values(each)
        assert SECRET not in _values(each)


def test_tracing_off_loads_no_sdk_in_serve_or_a_worker() -> None:
    # Free when off: the processes build the intake, the API and the dispatcher without
    # OpenTelemetry's SDK or exporter in memory (FastAPI imports its API for itself).
    program = (
        "import sys\n"
        "SDK = ('opentelemetry.sdk', 'opentelemetry.exporter', 'google.protobuf')\n"
        "from app.cli.service import _tracing_problem\n"
        "from app.config import Settings\n"
        "from app.main import create_app\n"
        "import app.worker, app.intake.route, app.dispatch.runner\n"
        "assert _tracing_problem('serve') is None\n"
        "create_app(Settings(database_url='sqlite:///unused.db', secret_token='s'))\n"
        "print(sorted(name for name in sys.modules if name.startswith(SDK)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_delivery_without_its_update_s_trace_begins_one_of_its_own(
    exported: InMemorySpanExporter,
) -> None:
    # An update recorded with tracing off keeps no trace: its deliveries begin their own,
    # never a child of whatever span happens to be current; with one, they join it.
    tracer = tracing.tracer()
    assert tracer is not None
    intake = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"
    with tracer.start_as_current_span("something else"):
        for traceparent in (None, intake):
            with tracing.span_of(tracer, "deliver", traceparent, {"intake.deliveries": 0}):
                pass
    alone, joined, other = exported.get_finished_spans()
    assert other.context is not None
    assert alone.context is not None
    assert alone.parent is None
    assert alone.context.trace_id != other.context.trace_id
    assert joined.context is not None
    assert joined.parent is not None
    assert (joined.context.trace_id, joined.parent.span_id) == (
        int("ab" * 16, 16),
        int("cd" * 8, 16),
    )
    assert _attribute(joined, "intake.deliveries") == 0
    with tracing.span_of(None, "deliver", intake, {}) as off:  # tracing off: no span at all
        assert off is None
    assert len(exported.get_finished_spans()) == 3


def test_log_lines_inside_a_span_carry_its_ids(exported: InMemorySpanExporter) -> None:
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    root = logging.getLogger()
    handler = Keep()
    root.addHandler(handler)
    try:
        logs.carry_trace_ids([handler])
        tracer = tracing.tracer()
        assert tracer is not None
        with tracer.start_as_current_span("attempt") as span:
            logging.getLogger("app.test").warning("inside")
        logging.getLogger("app.test").warning("outside")
    finally:
        root.removeHandler(handler)
    inside, outside = records[-2:]
    context = span.get_span_context()
    assert inside.__dict__["trace_id"] == format(context.trace_id, "032x")
    assert inside.__dict__["span_id"] == format(context.span_id, "016x")
    assert "trace_id" not in outside.__dict__


async def test_each_attempt_joins_its_update_s_trace_and_hands_it_downstream(
    storage: Storage, downstream: FakeDownstream, exported: InMemorySpanExporter
) -> None:
    # The intake and a dispatcher, as `run` has them, the dispatcher with a store of its own
    # (a worker's): the first attempt answered 500, the second 200.
    downstream.answer = by_attempt(status(500), ok)
    settings = settings_for(storage.url(), bot(downstream))
    async with serve_asgi(create_app(settings)) as base, dispatching(settings):
        await _post(base, message(5, text="pay 42"))
        await eventually(lambda: len(_of_kind(exported, SpanKind.CONSUMER)) == 2)
    [intake] = await _intake_spans(exported, 1)
    assert intake.context is not None
    trace_id = intake.context.trace_id
    attempts = sorted(
        _of_kind(exported, SpanKind.CONSUMER), key=lambda s: _attribute(s, "intake.attempt")
    )
    forwards = _of_kind(exported, SpanKind.CLIENT)
    received = downstream.received
    assert [r.attempt for r in received] == [1, 2]
    for number, (attempt, outcome) in enumerate(
        zip(attempts, ("retry", "completed"), strict=True), 1
    ):
        assert attempt.name == "process shop"
        assert attempt.context is not None
        assert attempt.context.trace_id == trace_id  # one trace for the update
        assert attempt.parent is not None
        assert attempt.parent.span_id == intake.context.span_id  # each attempt, the intake's child
        assert _attribute(attempt, "intake.outcome") == outcome
        assert _attribute(attempt, "intake.update_id") == 5
        assert (
            _attribute(attempt, "intake.claim_id")
            == received[number - 1].headers["x-intake-claim-id"]
        )
        [forward] = [
            f
            for f in forwards
            if f.parent is not None and f.parent.span_id == attempt.context.span_id
        ]
        assert forward.context is not None
        assert _attribute(forward, "http.response.status_code") == (500, 200)[number - 1]
        assert _attribute(forward, "server.address") == "127.0.0.1"
        # A 500 is the forward's failure (the attempt's own plan, a retry, is no error).
        failed = StatusCode.ERROR if number == 1 else StatusCode.UNSET
        assert forward.status.status_code is failed
        # The request carried the forward's own span as the parent of the bot's spans.
        traceparent = (
            f"00-{trace_id:032x}-{forward.context.span_id:016x}-{forward.context.trace_flags:02x}"
        )
        assert received[number - 1].headers["traceparent"] == traceparent
        settles = [
            s.name
            for s in exported.get_finished_spans()
            if s.name.startswith("settle ")
            and s.parent is not None
            and s.parent.span_id == attempt.context.span_id
        ]
        assert settles == [("settle failed", "settle completed")[number - 1]]
        # The claim that took it, with the claim statement's own times: the attempt begins
        # with it, and its forward follows it.
        [claim] = [
            s
            for s in exported.get_finished_spans()
            if s.name == "claim" and s.parent is not None
            and s.parent.span_id == attempt.context.span_id
        ]  # fmt: skip
        assert _attribute(claim, "messaging.batch.message_count") == 1
        assert claim.start_time == attempt.start_time
        assert claim.start_time is not None
        assert claim.end_time is not None
        assert forward.start_time is not None
        assert claim.start_time < claim.end_time <= forward.start_time
    assert attempts[0].status.status_code is StatusCode.UNSET  # a retry is the plan working
    for each in exported.get_finished_spans():  # never a body, a token or a secret
        for secret in ("pay 42", DOWNSTREAM_MODULE_SECRET, DOWNSTREAM_SECRET, SIGNING_SECRET):
            assert secret not in _values(each)


async def test_an_exhaustion_s_deliveries_join_its_update_s_trace(
    storage: Storage, downstream: FakeDownstream, exported: InMemorySpanExporter
) -> None:
    # A terminal answer ends the update: its exhaustion goes to exhaustion_url and is
    # acknowledged, and exhaustion.created goes to operations_url, each a span of the
    # update's trace whose POST hands the trace on.
    downstream.answer = status(400)
    shop = bot(downstream, exhaustion_url=f"{downstream.url}/exhausted")
    settings = settings_for(
        storage.url(),
        shop,
        operations_url=f"{downstream.url}/operations",
        operations_signing_secret=SIGNING_SECRET,
    )
    async with serve_asgi(create_app(settings)) as base, dispatching(settings):
        await _post(base, message(7, text="pay 42"))

        def delivered() -> bool:
            names = {s.name for s in exported.get_finished_spans()}
            return {"deliver exhaustion", "deliver exhaustion.created"} <= names

        await eventually(delivered)
    [intake] = await _intake_spans(exported, 1)
    assert intake.context is not None
    spans = exported.get_finished_spans()
    [attempt] = _of_kind(exported, SpanKind.CONSUMER)
    assert _attribute(attempt, "intake.outcome") == "terminal"
    assert [s.name for s in _children(spans, attempt)] == ["claim", "POST", "exhaust"]
    for name, received, outcome_span in (
        ("deliver exhaustion", downstream.exhaustions, "acknowledge exhaustion"),
        ("deliver exhaustion.created", downstream.operations, "mark delivered"),
    ):
        [delivery] = [s for s in spans if s.name == name]
        assert delivery.context is not None
        assert delivery.context.trace_id == intake.context.trace_id, name  # the update's trace
        assert delivery.parent is not None
        assert delivery.parent.span_id == intake.context.span_id, name
        assert _attribute(delivery, "intake.outcome") == "delivered"
        post, marked = _children(spans, delivery)
        assert (post.name, post.kind, marked.name) == ("POST", SpanKind.CLIENT, outcome_span)
        assert _attribute(post, "http.response.status_code") == 200
        assert _attribute(marked, "intake.took_effect") is True
        assert post.context is not None
        # The receiver got the POST's own span as the parent of its spans.
        [request] = received
        assert request.headers["traceparent"] == tracing.traceparent(post)
    [delivery] = [s for s in spans if s.name == "deliver exhaustion"]
    assert _attribute(delivery, "intake.claim_id") == _attribute(attempt, "intake.claim_id")
    for each in spans:  # never a body, a token or a secret
        for secret in ("pay 42", DOWNSTREAM_MODULE_SECRET, DOWNSTREAM_SECRET, SIGNING_SECRET):
            assert secret not in _values(each)


async def _post(base: str, update: str) -> None:
    """POST `update` to bot shop's webhook at `base`, as Telegram does: it must answer 200."""
    headers = {"X-Telegram-Bot-Api-Secret-Token": DOWNSTREAM_MODULE_SECRET}
    async with httpx.AsyncClient(base_url=base) as client:
        posted = await client.post("/telegram/shop", content=update, headers=headers)
        assert posted.status_code == 200


def _children(spans: Sequence[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    """The spans whose parent is `parent`, in the order they began."""
    assert parent.context is not None
    span_id = parent.context.span_id
    found = [s for s in spans if s.parent is not None and s.parent.span_id == span_id]
    return sorted(found, key=lambda s: s.start_time or 0)


def _of_kind(exporter: InMemorySpanExporter, kind: SpanKind) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.kind is kind]


def _attribute(span: ReadableSpan, name: str) -> Any:
    return (span.attributes or {}).get(name)
