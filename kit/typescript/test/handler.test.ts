/** intakeHandler's HTTP side, with a generic bot (any object with handleUpdate). */

import { test } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import {
  currentAttempt,
  intakeHandler,
  TerminalError,
  type IntakeAttempt,
  type IntakeRequestHandler,
} from "../src/index";
import {
  forward,
  forwardedHeaders,
  lines,
  noUnhandledRejections,
  serve,
  SHOP,
  SIGNING,
  sleep,
  textUpdate,
  TOKEN,
} from "./helpers";

noUnhandledRejections();

/** A bot of no known framework: it records what it ran and the attempt it ran in. */
function genericBot(
  work: (update: { update_id: number }) => Promise<void> = async () => undefined,
) {
  const handled: { update: unknown; attempt: IntakeAttempt | undefined }[] = [];
  return {
    handled,
    async handleUpdate(update: { update_id: number }): Promise<void> {
      handled.push({ update, attempt: currentAttempt() });
      await work(update);
    },
  };
}

async function post(url: string, body: string, headers: Record<string, string>) {
  const response = await fetch(url, { method: "POST", headers, body });
  return { status: response.status, body: (await response.json()) as Record<string, unknown> };
}

test("intakeHandler refuses options that cannot work", () => {
  const bot = genericBot();
  assert.throws(() => intakeHandler(bot, {}), /secretToken or signingSecret/);
  assert.throws(
    () => intakeHandler(bot, { signingSecret: "whsec_not base64" }),
    /whsec_ and base64/,
  );
  assert.throws(() => intakeHandler(bot, { secretToken: "t", apiKey: "k" }), /together/);
  assert.throws(() => intakeHandler(bot, { secretToken: "t", deferAfter: -1 }), /deferAfter/);
  assert.throws(() => intakeHandler({} as never, { secretToken: "t" }), /handleUpdate/);
});

test("a generic bot runs the update; currentAttempt() is its attempt", async () => {
  const bot = genericBot();
  const { url } = await serve(intakeHandler(bot, { signingSecret: SIGNING }));
  const answer = await forward(url, textUpdate(12, "hi"));
  assert.equal(answer.status, 200);
  assert.equal((bot.handled[0]?.update as { update_id: number }).update_id, 12);
  assert.deepEqual(bot.handled[0]?.attempt?.identity, SHOP);
  assert.equal((await forward(url, textUpdate(13, "hi"), null)).status, 200);
  assert.equal(bot.handled[1]?.attempt, undefined);
});

test("an attempt of another destination has it, keyed and signed as the service does", async () => {
  const bot = genericBot();
  const { url } = await serve(intakeHandler(bot, { signingSecret: SIGNING }));
  const payments = { ...SHOP, destination: "payments" };
  assert.equal((await forward(url, textUpdate(12, "hi"), payments)).status, 200);
  const attempt = bot.handled[0]?.attempt;
  assert.deepEqual(attempt?.identity, payments);
  assert.equal(attempt?.destination, "payments");
  assert.equal(attempt?.key, "shop:payments:12");
  // The identity signature covers the destination: another one's headers do not pass.
  const body = JSON.stringify(textUpdate(12, "hi"));
  const headers = forwardedHeaders(body, payments);
  headers["x-intake-destination"] = "analytics";
  const answer = await fetch(url, { method: "POST", headers, body });
  assert.equal(answer.status, 401);
  assert.equal(bot.handled.length, 1);
  // Without the header (a service from before destinations) it is default.
  assert.equal((await forward(url, textUpdate(12, "hi"))).status, 200);
  assert.equal(bot.handled[1]?.attempt?.destination, "default");
  assert.equal(bot.handled[1]?.attempt?.key, "shop:12");
});

test("a generic bot's TerminalError is 422, another error 500, a non-Error thrown 500", async () => {
  const bot = genericBot(async (update) => {
    if (update.update_id === 1) throw new TerminalError("no");
    if (update.update_id === 2) throw new RangeError("bad range");
    throw "a string"; // not an Error: still answered
  });
  const { url } = await serve(intakeHandler(bot, { secretToken: TOKEN }));
  const terminal = await forward(url, textUpdate(1, "x"), null);
  assert.deepEqual([terminal.status, terminal.body], [422, { error: "no" }]);
  const ranged = await forward(url, textUpdate(2, "x"), null);
  assert.deepEqual([ranged.status, ranged.body], [500, { error: "RangeError: bad range" }]);
  const stringy = await forward(url, textUpdate(3, "x"), null);
  assert.deepEqual([stringy.status, stringy.body], [500, { error: "a string" }]);
});

test("only POST; 405 otherwise", async () => {
  const { url } = await serve(intakeHandler(genericBot(), { secretToken: TOKEN }));
  const response = await fetch(url);
  assert.equal(response.status, 405);
  assert.equal(response.headers.get("allow"), "POST");
});

test("a body over maxBodyBytes is 413, announced or streamed", async () => {
  const bot = genericBot();
  const { url } = await serve(intakeHandler(bot, { secretToken: TOKEN, maxBodyBytes: 100 }));
  const big = JSON.stringify(textUpdate(1, "x".repeat(200)));
  const headers = forwardedHeaders(big, undefined);
  assert.equal((await post(url, big, headers)).status, 413);
  const streamed = await new Promise<number>((resolve, reject) => {
    const request = http.request(`${url}/`, { method: "POST", headers }, (response) => {
      response.resume();
      resolve(response.statusCode ?? 0);
    });
    request.on("error", reject);
    request.write(big.slice(0, 60));
    setTimeout(() => request.end(big.slice(60)), 20);
  });
  assert.equal(streamed, 413);
  assert.equal(bot.handled.length, 0);
});

test("a verified body that is no update is 400, and nothing runs", async () => {
  const bot = genericBot();
  const { url } = await serve(intakeHandler(bot, { signingSecret: SIGNING }));
  const unsigned = await post(url, "[1]", forwardedHeaders('{"update_id": 1}', undefined));
  assert.equal(unsigned.status, 401, "the signature is checked before the body is read");
  const signedNotUpdate = await postSigned(url, '{"update_id": "1"}');
  assert.deepEqual(signedNotUpdate, {
    status: 400,
    body: { error: "the body is not a Telegram update (no integer update_id)" },
  });
  assert.equal(bot.handled.length, 0);
});

async function postSigned(url: string, body: string) {
  // Signed as the service would, with webhook-id naming update 1.
  const headers = forwardedHeaders('{"update_id": 1}', undefined);
  const { Webhook } = await import("standardwebhooks");
  const at = new Date(Number(headers["webhook-timestamp"]) * 1000);
  headers["webhook-signature"] = new Webhook(SIGNING).sign("shop:1", at, body);
  return post(url, body, headers);
}

/** The handler behind a stand-in for an Express body parser that ran first. */
function behindParser(
  handler: IntakeRequestHandler,
  parse: (raw: Buffer) => unknown,
): http.RequestListener {
  return (req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (chunk: Buffer) => chunks.push(chunk));
    req.on("end", () => {
      (req as { body?: unknown }).body = parse(Buffer.concat(chunks));
      void handler(req, res, () => assert.fail("next is never called"));
    });
  };
}

test("a Buffer or string req.body (express.raw, express.text) is read as the body", async () => {
  for (const parse of [(raw: Buffer) => raw, (raw: Buffer) => raw.toString("utf8")]) {
    const bot = genericBot();
    const { url } = await serve(
      behindParser(intakeHandler(bot, { signingSecret: SIGNING }), parse),
    );
    assert.equal((await forward(url, textUpdate(12, "héllo"))).status, 200);
    assert.equal(bot.handled.length, 1);
  }
});

test("a req.body parsed as JSON is 500 with what to do: the bytes are gone", async () => {
  const bot = genericBot();
  const logged = lines();
  const handler = intakeHandler(bot, { signingSecret: SIGNING, log: logged.log });
  const { url } = await serve(behindParser(handler, (raw) => JSON.parse(raw.toString("utf8"))));
  const answer = await forward(url, textUpdate(12, "hi"));
  assert.equal(answer.status, 500);
  assert.match(String(answer.body["error"]), /mount intakeHandler before any body parser/);
  assert.equal(bot.handled.length, 0);
});

test("a client that hangs up mid-handler leaves no rejection and the server serving", async () => {
  const bot = genericBot(() => sleep(200));
  const { url } = await serve(intakeHandler(bot, { secretToken: TOKEN }));
  const body = JSON.stringify(textUpdate(1, "x"));
  const aborted = fetch(url, {
    method: "POST",
    headers: forwardedHeaders(body, undefined),
    body,
    signal: AbortSignal.timeout(50),
  });
  await assert.rejects(aborted, { name: "TimeoutError" });
  await sleep(300);
  assert.equal((await forward(url, textUpdate(2, "x"), null)).status, 200);
});

test("a handleUpdate that throws at once is 500, never a crash", async () => {
  const bot = {
    handleUpdate(): never {
      throw new Error("sync");
    },
  };
  const { url } = await serve(intakeHandler(bot, { secretToken: TOKEN }));
  const answer = await forward(url, textUpdate(1, "x"), null);
  assert.deepEqual([answer.status, answer.body], [500, { error: "Error: sync" }]);
});
