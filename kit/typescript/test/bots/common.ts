/**
 * What both test bots share: their settings from the environment, the behaviour
 * the Python end-to-end tests drive them with, and the server they listen on.
 *
 * BOT_TOKEN, BOT_API_ROOT (the fake Bot API, no trailing slash), PORT;
 * SECRET_TOKEN, SIGNING_SECRET (at least one), INTAKE_URL and API_KEY (together,
 * optional), DEFER_AFTER (seconds, optional). With OTEL_EXPORTER_OTLP_ENDPOINT the bot
 * traces as a Node service would, with OpenTelemetry's SDK of its own exporting over
 * OTLP (OTEL_SERVICE_NAME names it), and each message's handling is a span.
 */

import http from "node:http";
import { context, propagation, trace, type Tracer } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { W3CTraceContextPropagator } from "@opentelemetry/core";
import { OTLPTraceExporter } from "@opentelemetry/exporter-trace-otlp-proto";
import { resourceFromAttributes } from "@opentelemetry/resources";
import { BasicTracerProvider, BatchSpanProcessor } from "@opentelemetry/sdk-trace-base";
import {
  TerminalError,
  type IntakeAttempt,
  type IntakeHandlerOptions,
  type IntakeRequestHandler,
} from "../../src/index";

export interface Settings {
  token: string;
  apiRoot: string;
  port: number;
  options: IntakeHandlerOptions;
}

export function settings(env: NodeJS.ProcessEnv = process.env): Settings {
  const required = (name: string): string => {
    const value = env[name];
    if (!value) throw new Error(`${name} is required`);
    return value;
  };
  const optional = (name: string): string | undefined => env[name] || undefined;
  const deferAfter = optional("DEFER_AFTER");
  return {
    token: required("BOT_TOKEN"),
    apiRoot: required("BOT_API_ROOT"),
    port: Number(required("PORT")),
    options: {
      secretToken: optional("SECRET_TOKEN"),
      signingSecret: optional("SIGNING_SECRET"),
      intakeUrl: optional("INTAKE_URL"),
      apiKey: optional("API_KEY"),
      ...(deferAfter === undefined ? {} : { deferAfter: Number(deferAfter) }),
    },
  };
}

/** The bot's tracer when the environment asks for tracing (the module's rule). */
function tracing(env: NodeJS.ProcessEnv = process.env): Tracer | undefined {
  if (!env["OTEL_EXPORTER_OTLP_ENDPOINT"]) return undefined;
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  propagation.setGlobalPropagator(new W3CTraceContextPropagator());
  const provider = new BasicTracerProvider({
    resource: resourceFromAttributes({ "service.name": env["OTEL_SERVICE_NAME"] ?? "bot" }),
    // The exporter reads its endpoint, and the processor its schedule, from OTEL_*.
    spanProcessors: [new BatchSpanProcessor(new OTLPTraceExporter())],
  });
  trace.setGlobalTracerProvider(provider);
  return provider.getTracer("test bot");
}

const tracer = tracing();

/**
 * One text message: "fail-once" fails attempt 1, "terminal" is a TerminalError,
 * "sleep:MS" waits; then the bot sends the chat what it saw, as JSON. In a span
 * "handle message" when the bot traces.
 */
export async function handleText(
  text: string,
  updateId: number,
  intake: IntakeAttempt | undefined,
  send: (text: string) => Promise<unknown>,
): Promise<void> {
  if (tracer === undefined) return behave(text, updateId, intake, send);
  return tracer.startActiveSpan(
    "handle message",
    { attributes: { "bot.update_id": updateId } },
    async (span) => {
      try {
        await behave(text, updateId, intake, send);
      } finally {
        span.end();
      }
    },
  );
}

async function behave(
  text: string,
  updateId: number,
  intake: IntakeAttempt | undefined,
  send: (text: string) => Promise<unknown>,
): Promise<void> {
  if (text === "fail-once" && intake?.identity.attempt === 1) throw new Error("fail-once");
  if (text === "terminal") throw new TerminalError("terminal");
  if (text.startsWith("sleep:")) {
    await new Promise((resolve) => setTimeout(resolve, Number(text.slice("sleep:".length))));
  }
  const seen =
    intake === undefined
      ? null
      : {
          bot: intake.identity.bot,
          update_id: Number(intake.identity.updateId),
          attempt: intake.identity.attempt,
          claim_id: intake.identity.claimId,
          owns: process.env["INTAKE_URL"] ? await intake.owns() : null,
        };
  await send(JSON.stringify({ update_id: updateId, text, intake: seen }));
}

export function listen(handler: IntakeRequestHandler, port: number): http.Server {
  return http
    .createServer((req, res) => void handler(req, res))
    .listen(port, "127.0.0.1", () => console.log(`listening on ${port}`));
}
