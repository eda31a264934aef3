/**
 * Test doubles on node:http: a fake Bot API (getMe, sendMessage, ...), a fake
 * callback API of the service, and a client that sends what the service sends.
 */

import { after } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { Webhook } from "standardwebhooks";
import { identityKey, identityMessage, type Identity } from "../src/index";

export const SIGNING = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
export const TOKEN = "behind-the-intake";
export const BOT_TOKEN = "123:abc";
export const LEASE = 1_796_126_467_000;
export const RECEIVED_AT = 1_796_126_400_123;

export interface Served {
  url: string;
  close(): Promise<void>;
}

/** Serve `handler` on 127.0.0.1 at a free port; closed after the file's tests. */
export async function serve(handler: http.RequestListener): Promise<Served> {
  const server = http.createServer(handler);
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  let closed = false;
  const close = async (): Promise<void> => {
    if (closed) return;
    closed = true;
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  };
  after(close);
  return { url: `http://127.0.0.1:${port}`, close };
}

async function readJson(req: http.IncomingMessage): Promise<Record<string, unknown>> {
  const chunks: Buffer[] = [];
  for await (const chunk of req) chunks.push(chunk as Buffer);
  const text = Buffer.concat(chunks).toString("utf8");
  return text === "" ? {} : (JSON.parse(text) as Record<string, unknown>);
}

function send(res: http.ServerResponse, status: number, body: unknown): void {
  res.writeHead(status, { "content-type": "application/json" });
  res.end(JSON.stringify(body));
}

export interface ApiCall {
  method: string;
  body: Record<string, unknown>;
  at: number;
}

/** A Bot API at `{root}/bot{token}/{method}` that records every call. */
export async function fakeBotApi(): Promise<Served & { root: string; calls: ApiCall[] }> {
  const calls: ApiCall[] = [];
  const served = await serve(async (req, res) => {
    const method = (req.url ?? "").split("/").pop() ?? "";
    const body = await readJson(req);
    calls.push({ method, body, at: Date.now() });
    if (method === "getMe") {
      send(res, 200, {
        ok: true,
        result: { id: 123, is_bot: true, first_name: "T", username: "t_bot" },
      });
    } else if (method === "sendMessage") {
      const chat = { id: body["chat_id"], type: "private" };
      send(res, 200, {
        ok: true,
        result: { message_id: calls.length, date: 0, chat, text: body["text"] },
      });
    } else {
      send(res, 200, { ok: true, result: true });
    }
  });
  return { ...served, root: served.url, calls };
}

export interface IntakeCall {
  path: string;
  authorization: string | undefined;
  raw: string;
  body: Record<string, unknown>;
  at: number;
}

/** The service's callback API; `answers[path]` says what each call answers. */
export async function fakeIntake(
  answers: Record<string, { status?: number; body: unknown }> = {},
): Promise<Served & { calls: IntakeCall[]; answers: typeof answers }> {
  const calls: IntakeCall[] = [];
  const defaults: Record<string, unknown> = {
    "/v1/claims/owns": { owned: true, lease_expires_at: LEASE },
    "/v1/claims/renew": { renewed: true, lease_expires_at: LEASE },
    "/v1/claims/settle": { settled: true },
    "/v1/exhaustions/acknowledge": { acknowledged: true },
  };
  const served = await serve(async (req, res) => {
    const chunks: Buffer[] = [];
    for await (const chunk of req) chunks.push(chunk as Buffer);
    const raw = Buffer.concat(chunks).toString("utf8");
    const path = req.url ?? "";
    calls.push({
      path,
      authorization: req.headers.authorization,
      raw,
      body: JSON.parse(raw),
      at: Date.now(),
    });
    const answer = answers[path] ?? { body: defaults[path] ?? { error: "no such path" } };
    send(res, answer.status ?? (path in defaults ? 200 : 404), answer.body);
  });
  return { ...served, calls, answers };
}

export const SHOP: Identity = {
  bot: "shop",
  updateId: "12",
  attempt: 1,
  claimId: "claim-1",
  destination: "default",
};

export function textUpdate(updateId: number, text: string, chat = 42): Record<string, unknown> {
  return {
    update_id: updateId,
    message: {
      message_id: updateId,
      date: Math.floor(Date.now() / 1000),
      chat: { id: chat, type: "private", first_name: "A" },
      from: { id: chat, is_bot: false, first_name: "A" },
      text,
    },
  };
}

/**
 * The headers of one forwarded attempt as the service sends them, signed by the
 * `standardwebhooks` package (not the kit's own `sign`); `identity` undefined is a plain bot.
 */
export function forwardedHeaders(
  body: string,
  identity: Identity | undefined,
  { secret = SIGNING, token = TOKEN }: { secret?: string; token?: string } = {},
): Record<string, string> {
  const webhook = new Webhook(secret);
  const at = new Date();
  const headers: Record<string, string> = {
    "content-type": "application/json",
    "x-telegram-bot-api-secret-token": token,
  };
  const updateId = String((JSON.parse(body) as { update_id: number }).update_id);
  const messageId = identity === undefined ? `shop:${updateId}` : identityKey(identity);
  if (identity !== undefined) {
    // A service from before destinations sends no destination: `default` is what it means.
    if (identity.destination !== "default") headers["x-intake-destination"] = identity.destination;
    headers["x-intake-bot"] = identity.bot;
    headers["x-intake-update-id"] = identity.updateId;
    headers["x-intake-attempt"] = String(identity.attempt);
    headers["x-intake-claim-id"] = identity.claimId;
    headers["x-intake-lease-expires-at"] = String(LEASE);
    headers["x-intake-received-at"] = String(RECEIVED_AT);
    headers["x-intake-identity-signature"] = webhook.sign(
      identityMessage(identity, String(RECEIVED_AT)),
      at,
      "",
    );
  }
  headers["webhook-id"] = messageId;
  headers["webhook-timestamp"] = String(Math.floor(at.getTime() / 1000));
  headers["webhook-signature"] = webhook.sign(messageId, at, body);
  return headers;
}

export interface Answer {
  status: number;
  body: Record<string, unknown>;
  at: number;
}

/** POST one forwarded update to `url`, as the service does; `identity` null: a plain bot. */
export async function forward(
  url: string,
  update: Record<string, unknown>,
  identity: Identity | null = SHOP,
  options: { secret?: string; token?: string } = {},
): Promise<Answer> {
  const body = JSON.stringify(update);
  const response = await fetch(url, {
    method: "POST",
    headers: forwardedHeaders(body, identity ?? undefined, options),
    body,
  });
  const text = await response.text();
  return { status: response.status, body: text === "" ? {} : JSON.parse(text), at: Date.now() };
}

export const sleep = (ms: number): Promise<void> =>
  new Promise((resolve) => setTimeout(resolve, ms));

/** Wait until `condition()` holds, or fail after `ms`. */
export async function eventually(condition: () => boolean, ms = 5000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!condition()) {
    if (Date.now() > deadline) assert.fail("the condition did not hold in time");
    await sleep(20);
  }
}

/**
 * Fail the file on any unhandled rejection: the kit must never leave one (Node 20
 * would end the process with it under the default mode).
 */
export function noUnhandledRejections(): void {
  const seen: unknown[] = [];
  const listener = (reason: unknown): void => {
    seen.push(reason);
  };
  process.on("unhandledRejection", listener);
  after(() => {
    process.off("unhandledRejection", listener);
    assert.deepEqual(seen, [], "no unhandled rejection");
  });
}

/** A `log` option that keeps the lines. */
export function lines(): { log: (line: string) => void; seen: string[] } {
  const seen: string[] = [];
  return { log: (line) => seen.push(line), seen };
}
