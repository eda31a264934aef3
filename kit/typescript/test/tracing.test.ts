/** The handlers continue the update's trace that the service's forward names. */

import { test } from "node:test";
import assert from "node:assert/strict";
import { context, propagation, trace } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { W3CTraceContextPropagator } from "@opentelemetry/core";
import {
  BasicTracerProvider,
  InMemorySpanExporter,
  SimpleSpanProcessor,
} from "@opentelemetry/sdk-trace-base";
import { intakeHandler } from "../src/index";
import {
  forwardedHeaders,
  noUnhandledRejections,
  serve,
  SIGNING,
  sleep,
  textUpdate,
} from "./helpers";

noUnhandledRejections();

test("the handlers' spans are children of the span the forward names", async () => {
  // The bot traces as the OpenTelemetry SDK sets a Node process up.
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  propagation.setGlobalPropagator(new W3CTraceContextPropagator());
  const exporter = new InMemorySpanExporter();
  const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
  const tracer = provider.getTracer("the bot");
  const bot = {
    async handleUpdate(): Promise<void> {
      await sleep(5); // across an await: the context is the handler's own
      tracer.startActiveSpan("the bot's handler", (span) => span.end());
    },
  };
  const { url } = await serve(intakeHandler(bot, { signingSecret: SIGNING }));
  const traceId = "ab".repeat(16);
  const parentId = "cd".repeat(8);
  for (const traceparent of [`00-${traceId}-${parentId}-01`, undefined]) {
    const body = JSON.stringify(textUpdate(traceparent ? 1 : 2, "hi"));
    const headers = forwardedHeaders(body, undefined) // a plain bot's forward: no identity;
    if (traceparent) headers.traceparent = traceparent;
    const response = await fetch(url, { method: "POST", headers, body });
    assert.equal(response.status, 200, await response.text());
  }
  const [continued, alone] = exporter.getFinishedSpans();
  assert.equal(continued?.spanContext().traceId, traceId);
  assert.equal(continued?.parentSpanContext?.spanId, parentId);
  assert.equal(alone?.parentSpanContext, undefined);
  assert.notEqual(alone?.spanContext().traceId, traceId);
  assert.equal(trace.getActiveSpan(), undefined); // nothing leaked out of the handlers
});
