"""Tracing (docs/contract.md section 15): OpenTelemetry spans over OTLP, one trace per update.

Off by default, and free when off: the SDK and the exporter are not imported (FastAPI imports
OpenTelemetry's API for its own telemetry, which stays off while no provider is set), and each
place that would make a span asks `tracer()` once, when it is built, and holds None.

On when the standard environment names an OTLP endpoint (`OTEL_EXPORTER_OTLP_ENDPOINT` or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) or asks for the exporter by name
(`OTEL_TRACES_EXPORTER=otlp`), unless `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`.
The SDK reads the rest itself: `OTEL_SERVICE_NAME` (default `telegram-intake`),
`OTEL_RESOURCE_ATTRIBUTES`, the exporter's headers, timeout and compression
(`OTEL_EXPORTER_OTLP_*`), the batching (`OTEL_BSP_*`) and the sampler (`OTEL_TRACES_SAMPLER`).
The service ships OTLP over HTTP with protobuf: another exporter or protocol named there
stops start-up with the variable's name (`TracingMisconfigured`), rather than exporting
nothing in silence.

Spans carry the update's identity (`intake.bot`, `intake.update_id`, `intake.attempt`,
`intake.claim_id`) and its outcome (`intake.outcome`) beside the OpenTelemetry semantic
conventions' HTTP attributes; never a body, a token or a secret.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.trace import Span, Tracer

__all__ = [
    "ATTEMPT",
    "BOT",
    "CLAIM_ID",
    "OUTCOME",
    "UPDATE_ID",
    "TracingMisconfigured",
    "context_of",
    "flush_tracing",
    "make_current",
    "recorded",
    "release",
    "span_of",
    "start_tracing",
    "stop_tracing",
    "traceparent",
    "tracer",
    "tracing_wanted",
]

SERVICE_NAME = "telegram-intake"
# The update's identity and its outcome, on every span of its trace.
BOT = "intake.bot"
UPDATE_ID = "intake.update_id"
ATTEMPT = "intake.attempt"
CLAIM_ID = "intake.claim_id"
OUTCOME = "intake.outcome"

_EXPORTER = "OTEL_TRACES_EXPORTER"
_ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
_PROTOCOLS = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")

_tracer: Tracer | None = None
_provider: TracerProvider | None = None


class TracingMisconfigured(ValueError):
    """The OTEL_* environment asks for something this service does not ship."""


def tracing_wanted(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the environment turns tracing on (the module's rule)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = _names(environ.get(_EXPORTER, ""))
    if exporters == ["none"]:
        return False
    # An exporter named, whichever: one this service does not ship is refused at start-up.
    return bool(exporters) or any(environ.get(name, "").strip() for name in _ENDPOINTS)


def tracer() -> Tracer | None:
    """The process's tracer, or None while tracing is off."""
    return _tracer


def start_tracing(
    role: str,
    environ: Mapping[str, str] = os.environ,
    *,
    processor: SpanProcessor | None = None,
) -> Tracer | None:
    """Turn tracing on for this process when the environment asks (`processor`: a span
    processor of the caller's, for tests; the environment is then not consulted), and return
    its tracer; None when off. `role` (serve, worker, run, ...) becomes the resource's
    `service.instance.role`. Called once, at the start of a command."""
    global _tracer, _provider
    if processor is None:
        if not tracing_wanted(environ):
            _tracer = _provider = None
            return None
        problem = _unsupported(environ)
        if problem:
            raise TracingMisconfigured(problem)
    from opentelemetry import trace

    provider = _make_provider(role, environ)
    if processor is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        trace.set_tracer_provider(provider)  # so that a library's spans join ours
    else:
        provider.add_span_processor(processor)
    _provider = provider
    _tracer = provider.get_tracer(SERVICE_NAME)
    return _tracer


def traceparent(span: Span) -> str:
    """The W3C `traceparent` naming `span` as the parent: what the row keeps (revision 0007)
    and what a forward sends."""
    context = span.get_span_context()
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def make_current(span: Span) -> object:
    """Make `span` the current one (its children's parent, its ids on log lines) until
    `release` is given the token returned. Not ended by either."""
    from opentelemetry import context, trace

    return context.attach(trace.set_span_in_context(span))


def release(token: object) -> None:
    """Undo `make_current`."""
    from opentelemetry import context

    context.detach(token)  # type: ignore[arg-type]


def context_of(traceparent: str | None) -> Context:
    """The context whose current span is the one `traceparent` names (a span of another
    process, the intake's): a span started in it is that span's child. For None, a context
    with no span: a span started in it begins a trace of its own, whatever is current."""
    from opentelemetry.context import Context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    if traceparent is None:
        return Context()
    return TraceContextTextMapPropagator().extract({"traceparent": traceparent})


@contextmanager
def span_of(
    tracer: Tracer | None, name: str, traceparent: str | None, attributes: Mapping[str, Any]
) -> Iterator[Span | None]:
    """An INTERNAL span `name`, current while the block runs, in the trace `traceparent`
    names (a trace of its own for None); None, and no span, when tracing is off. For the
    paths off the hot ones (deliveries): `attributes` is built either way."""
    if tracer is None:
        yield None
        return
    context = context_of(traceparent)
    with tracer.start_as_current_span(name, context=context, attributes=attributes) as span:
        yield span


def recorded(
    tracer: Tracer | None, name: str, write: Callable[[], Awaitable[bool]]
) -> Awaitable[bool]:
    """`write()`, a write that may not take effect (a fenced settle, an acknowledgement); with
    tracing on, in an INTERNAL span `name` that says whether it did (`intake.took_effect`).
    Off, `write()` itself: nothing between it and its caller."""
    if tracer is None:
        return write()
    return _recorded(tracer, name, write)


async def _recorded(tracer: Tracer, name: str, write: Callable[[], Awaitable[bool]]) -> bool:
    with tracer.start_as_current_span(name) as span:
        took = await write()
        span.set_attribute("intake.took_effect", took)
        return took


def flush_tracing(timeout_seconds: float = 10.0) -> None:
    """Export every span ended so far, waiting up to `timeout_seconds` (blocking): at a
    graceful stop, whose end may not run the SDK's own exit hook (uvicorn ends a process it
    stopped on SIGTERM by raising the signal again). Nothing when tracing is off."""
    if _provider is not None:
        _provider.force_flush(int(timeout_seconds * 1000))


def stop_tracing() -> None:
    """Turn tracing off again (tests); spans already ended stay with their processor."""
    global _tracer, _provider
    _tracer = _provider = None


def _make_provider(role: str, environ: Mapping[str, str]) -> TracerProvider:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    named = environ.get("OTEL_SERVICE_NAME", "").strip() or "service.name=" in environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    )
    ours = {"service.instance.role": role}
    if not named:
        ours["service.name"] = SERVICE_NAME  # the environment's name, when it gives one, wins
    # Resource.create reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES from os.environ.
    return TracerProvider(resource=Resource.create(ours))


def _unsupported(environ: Mapping[str, str]) -> str | None:
    others = [name for name in _names(environ.get(_EXPORTER, "")) if name != "otlp"]
    if others:
        return (
            f"{_EXPORTER}={environ[_EXPORTER]}: this service exports traces over OTLP only "
            "(otlp, or none to turn tracing off)"
        )
    for name in _PROTOCOLS:
        protocol = environ.get(name, "").strip()
        if protocol and protocol != "http/protobuf":
            return (
                f"{name}={protocol}: this service exports OTLP over HTTP with protobuf "
                "(http/protobuf); point it at the collector's HTTP port (4318)"
            )
    return None


def _names(value: str) -> list[str]:
    return [name.strip().lower() for name in value.split(",") if name.strip()]
