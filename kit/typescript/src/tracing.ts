/**
 * The update's trace, continued in the handlers (docs/kit.md). When the
 * service's tracing is on, each forward carries W3C `traceparent`. Where the
 * bot has `@opentelemetry/api` (an optional peer dependency), the handlers run
 * in the context the request's headers name, read by the bot's own propagator,
 * so the spans they start are children of the forward's span, in the update's
 * trace. Without the API, or without the header, they run as they would.
 */

import type { IncomingHttpHeaders } from "node:http";

type OpenTelemetry = typeof import("@opentelemetry/api");

let loaded: OpenTelemetry | null | undefined;

/** The bot's `@opentelemetry/api`, or null when it has none (looked up once). */
function openTelemetry(): OpenTelemetry | null {
  if (loaded === undefined) {
    try {
      // eslint-disable-next-line @typescript-eslint/no-require-imports
      loaded = require("@opentelemetry/api") as OpenTelemetry;
    } catch {
      loaded = null;
    }
  }
  return loaded;
}

/** `run()`, in the trace context `headers` name when they name one. */
export function inTrace<T>(headers: IncomingHttpHeaders, run: () => T): T {
  if (headers.traceparent === undefined) return run();
  const api = openTelemetry();
  if (api === null) return run();
  const parent = api.propagation.extract(api.context.active(), headers);
  return api.context.with(parent, run);
}
