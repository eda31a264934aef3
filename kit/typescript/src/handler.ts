/**
 * `intakeHandler(bot, options)`: the request handler a grammY or Telegraf bot
 * serves behind telegram-intake, in place of the framework's own webhook callback
 * (node:http, or Express mounted before any body parser).
 *
 * Each request is verified (`readForwarded`), its update run through the bot's
 * handlers to their end, and answered with what the service needs to know:
 * 200 done (also when the bot's own error handler took an error), 422 a
 * `TerminalError` (the update becomes an exhaustion), 500 any other error (the
 * service retries), 401 a request that is not the service's (nothing runs).
 * With `intakeUrl` and `apiKey`, handlers still running after `deferAfter`
 * seconds are answered 202 and settled later through the callback API. When
 * the forward carries W3C `traceparent` and the bot has `@opentelemetry/api`,
 * the handlers run in that trace (`./tracing`).
 */

import type { IncomingMessage, ServerResponse } from "node:http";
import { IntakeAttempt } from "./attempt";
import { IntakeClient } from "./client";
import { carryDeferred } from "./deferral";
import { readForwarded, Rejected, type Forwarded } from "./forwarded";
import { describe, Runner, type Ending, type UpdateHandler } from "./frameworks";
import type { Identity } from "./identity";
import { signingKey } from "./signature";
import { inTrace } from "./tracing";

export interface IntakeHandlerOptions {
  /** The bot's `downstream_secret_token` (`X-Telegram-Bot-Api-Secret-Token`). */
  secretToken?: string;
  /** The bot's `signing_secret` (`whsec_...`): Standard Webhooks signatures. */
  signingSecret?: string;
  /** The service's base URL, for the callback API (deferral and `ctx.intake.owns()`). */
  intakeUrl?: string;
  /** The callback API's bearer key. */
  apiKey?: string;
  /** Seconds after which a running update is answered 202 and settled later (default 10). */
  deferAfter?: number;
  /** The lease a deferred attempt renews, in seconds (default 30), every third of it. */
  deferredLeaseSeconds?: number;
  /** The largest body read (default 10 MiB); a larger one is answered 413. */
  maxBodyBytes?: number;
  /** Timestamp tolerance of the signature, in seconds (default 300). */
  toleranceSeconds?: number;
  /** Where the adapter's own lines go (default console.error). */
  log?: (line: string) => void;
}

/** node:http's `(req, res)`, and Express's `(req, res, next)`: it never calls `next`. */
export type IntakeRequestHandler = (
  req: IncomingMessage,
  res: ServerResponse,
  next?: (error?: unknown) => void,
) => Promise<void>;

const DEFAULT_MAX_BODY_BYTES = 10 * 1024 * 1024;

export function intakeHandler(
  bot: UpdateHandler,
  options: IntakeHandlerOptions,
): IntakeRequestHandler {
  const { secretToken, signingSecret, intakeUrl, apiKey, toleranceSeconds } = options;
  if (secretToken === undefined && signingSecret === undefined) {
    throw new TypeError(
      "intakeHandler needs secretToken or signingSecret: an unverified request proves nothing",
    );
  }
  if (signingSecret !== undefined) signingKey(signingSecret); // a malformed secret fails now
  if ((intakeUrl === undefined) !== (apiKey === undefined)) {
    throw new TypeError("give intakeUrl and apiKey together");
  }
  const deferAfter = positive("deferAfter", options.deferAfter ?? 10, true);
  const leaseMs =
    1000 * positive("deferredLeaseSeconds", options.deferredLeaseSeconds ?? 30, false);
  const maxBodyBytes = positive(
    "maxBodyBytes",
    options.maxBodyBytes ?? DEFAULT_MAX_BODY_BYTES,
    false,
  );
  const log = options.log ?? ((line: string) => console.error(`telegram-intake-kit: ${line}`));
  const runner = new Runner(bot);
  const client = intakeUrl && apiKey ? new IntakeClient(intakeUrl, apiKey) : undefined;
  if (client !== undefined && runner.finiteHandlerTimeout !== undefined) {
    log(
      `Telegraf's handlerTimeout (${runner.finiteHandlerTimeout} ms) fails a deferred update ` +
        "that runs longer: create the bot with { handlerTimeout: Infinity }",
    );
  }

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    if (req.method !== "POST") {
      res.setHeader("allow", "POST");
      answer(res, 405, { error: "only POST" });
      return;
    }
    const body = await readBody(req, maxBodyBytes);
    if (typeof body === "number") {
      res.setHeader("connection", "close");
      const error =
        body === 413
          ? `the body is larger than ${maxBodyBytes} bytes`
          : "the body was already read and parsed: mount intakeHandler before any body parser";
      answer(res, body, { error });
      return;
    }
    let forwarded: Forwarded;
    try {
      forwarded = readForwarded(req.headers, body, {
        signingSecret,
        secretToken,
        toleranceSeconds,
      });
    } catch (error) {
      if (!(error instanceof Rejected)) throw error;
      answer(res, error.status, { error: error.message });
      return;
    }
    const { identity, update } = forwarded;
    const attempt =
      identity === undefined ? undefined : new IntakeAttempt({ ...forwarded, identity }, client);
    // In the update's trace, where the service traces and the bot has OpenTelemetry.
    const running = inTrace(req.headers, () => runner.run(update, attempt));
    if (client === undefined || identity === undefined) {
      reply(res, await running);
      return;
    }
    await deferIfSlow(res, running, client, identity);
  }

  async function deferIfSlow(
    res: ServerResponse,
    running: Promise<Ending>,
    client: IntakeClient,
    identity: Identity,
  ): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<"late">((resolve) => {
      timer = setTimeout(() => resolve("late"), deferAfter * 1000);
    });
    const first = await Promise.race([running, late]);
    clearTimeout(timer);
    if (first !== "late") {
      reply(res, first);
      return;
    }
    answer(res, 202, { deferred: true });
    await carryDeferred(running, { client, identity, leaseMs, log });
  }

  return async (req, res) => {
    try {
      await handle(req, res);
    } catch (error) {
      // Nothing the kit expects: answered 500 (the service retries), never a rejection.
      log(`request failed: ${describe(error)}`);
      answer(res, 500, { error: describe(error) });
    }
  };
}

function reply(res: ServerResponse, ending: Ending): void {
  if (ending.kind === "completed") answer(res, 200, {});
  else if (ending.kind === "terminal") answer(res, 422, { error: ending.message });
  else answer(res, 500, { error: ending.text });
}

function answer(res: ServerResponse, status: number, body: object): void {
  if (res.headersSent || res.writableEnded || res.destroyed) return; // the caller has gone
  const text = JSON.stringify(body);
  res.statusCode = status;
  res.setHeader("content-type", "application/json");
  res.setHeader("content-length", Buffer.byteLength(text));
  res.end(text);
}

/**
 * The body's bytes, or the status to answer. An Express body parser that ran
 * first leaves `req.body`: a Buffer (`express.raw`) or a string (`express.text`)
 * is used as it is, and so is a `req.rawBody` Buffer; parsed JSON is not the
 * bytes that were signed, and the stream is spent: 500.
 */
async function readBody(req: IncomingMessage, max: number): Promise<Uint8Array | 413 | 500> {
  const parsed = (req as { body?: unknown }).body;
  const raw = (req as { rawBody?: unknown }).rawBody;
  const given = parsed instanceof Uint8Array || typeof parsed === "string" ? parsed : raw;
  if (given instanceof Uint8Array || typeof given === "string") {
    const bytes = typeof given === "string" ? Buffer.from(given, "utf8") : given;
    return bytes.byteLength > max ? 413 : bytes;
  }
  if (req.readableEnded) return 500;
  if (Number(req.headers["content-length"] ?? 0) > max) {
    req.resume();
    return 413;
  }
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    let settled = false;
    const finish = (result: Uint8Array | 413 | Error): void => {
      if (settled) return;
      settled = true;
      req.off("data", take);
      if (result instanceof Error) reject(result);
      else resolve(result);
    };
    const take = (chunk: Buffer): void => {
      size += chunk.length;
      if (size <= max) chunks.push(chunk);
      else {
        req.resume(); // drain the rest unread; the answer closes the connection
        finish(413);
      }
    };
    req.on("data", take);
    req.on("end", () => finish(Buffer.concat(chunks)));
    req.on("error", (error) => finish(error));
    req.on("close", () => finish(new Error("the request was aborted before its body ended")));
  });
}

function positive(name: string, value: number, zero: boolean): number {
  if (typeof value !== "number" || !Number.isFinite(value) || value < 0 || (!zero && value === 0)) {
    throw new TypeError(
      `${name} must be a ${zero ? "non-negative" : "positive"} number, not ${value}`,
    );
  }
  return value;
}
