/**
 * What intakeHandler must do with any framework, run by grammy.test.ts and
 * telegraf.test.ts with the real framework and a fake Bot API.
 */

import { test } from "node:test";
import assert from "node:assert/strict";
import {
  currentAttempt,
  intakeHandler,
  TerminalError,
  type IntakeAttempt,
  type IntakeHandlerOptions,
  type UpdateHandler,
} from "../src/index";
import {
  fakeBotApi,
  fakeIntake,
  forward,
  lines,
  serve,
  SHOP,
  SIGNING,
  sleep,
  textUpdate,
  TOKEN,
  eventually,
} from "./helpers";

export interface Harness {
  bot: UpdateHandler;
  /** Texts whose handler started. */
  ran: string[];
  /** What handlers saw of their attempt, for the text "intake". */
  seen: { intake: IntakeAttempt | undefined; current: IntakeAttempt | undefined; owns?: boolean }[];
  /** Errors the bot's own catch-all handler took. */
  caught: unknown[];
}

/** A bot of one framework whose handler for a text message calls `behave`. */
export type MakeBot = (apiRoot: string, options: { catchAll: boolean }) => Harness;

interface Context {
  intake?: IntakeAttempt;
  reply(text: string): Promise<unknown>;
}

/** The handlers' behaviour, by the message's text. */
export async function behave(text: string, ctx: Context, harness: Harness): Promise<void> {
  harness.ran.push(text);
  const [verb, argument] = text.split(":");
  const ms = Number(argument ?? 0);
  if (verb === "boom") throw new Error("boom");
  if (verb === "terminal") throw new TerminalError("gone for good");
  if (verb === "sleep") await sleep(ms);
  if (verb === "late-terminal") {
    await sleep(ms);
    throw new TerminalError("late terminal");
  }
  if (verb === "late-boom") {
    await sleep(ms);
    throw new Error("late boom");
  }
  if (verb === "intake") {
    const owns = argument === "owns" ? await ctx.intake?.owns() : undefined;
    harness.seen.push({ intake: ctx.intake, current: currentAttempt(), owns });
  }
  await ctx.reply(`done:${text}`);
}

interface SetUp {
  catchAll?: boolean;
  /** Give the handler the fake callback API (intakeUrl, apiKey). */
  withIntake?: boolean;
  answers?: Parameters<typeof fakeIntake>[0];
  options?: Partial<IntakeHandlerOptions>;
}

async function setUp(make: MakeBot, setup: SetUp = {}) {
  const api = await fakeBotApi();
  const intake = await fakeIntake(setup.answers);
  const harness = make(api.root, { catchAll: setup.catchAll ?? false });
  const logged = lines();
  const handler = intakeHandler(harness.bot, {
    signingSecret: SIGNING,
    secretToken: TOKEN,
    log: logged.log,
    ...(setup.withIntake ? { intakeUrl: intake.url, apiKey: "key-1" } : {}),
    ...setup.options,
  });
  const served = await serve(handler);
  const sent = () => api.calls.filter((call) => call.method === "sendMessage");
  const called = (path: string) => intake.calls.filter((call) => call.path.endsWith(path));
  return { api, intake, harness, logged, url: served.url, sent, called };
}

export function handlerSuite(framework: string, make: MakeBot): void {
  test(`${framework}: 200 {} once the handler has finished its work`, async () => {
    const { url, sent } = await setUp(make);
    const started = Date.now();
    const answer = await forward(url, textUpdate(12, "sleep:300"));
    assert.equal(answer.status, 200);
    assert.deepEqual(answer.body, {});
    assert.ok(answer.at - started >= 300, "answered after the handler's sleep");
    assert.equal(sent().length, 1);
    assert.ok((sent()[0]?.at ?? Infinity) <= answer.at, "sendMessage came before the answer");
  });

  test(`${framework}: 500 with the error when a handler throws`, async () => {
    const { url } = await setUp(make);
    const answer = await forward(url, textUpdate(12, "boom"));
    assert.equal(answer.status, 500);
    assert.deepEqual(answer.body, { error: "Error: boom" });
  });

  test(`${framework}: 422 on a TerminalError`, async () => {
    const { url } = await setUp(make);
    const answer = await forward(url, textUpdate(12, "terminal"));
    assert.equal(answer.status, 422);
    assert.deepEqual(answer.body, { error: "gone for good" });
  });

  test(`${framework}: 422 on a TerminalError even past a catch-all error handler`, async () => {
    const { url, harness } = await setUp(make, { catchAll: true });
    const answer = await forward(url, textUpdate(12, "terminal"));
    assert.equal(answer.status, 422);
    assert.deepEqual(answer.body, { error: "gone for good" });
    assert.ok(harness.caught.length <= 1);
  });

  test(`${framework}: 200 when the bot's own error handler takes an error`, async () => {
    const { url, harness } = await setUp(make, { catchAll: true });
    const answer = await forward(url, textUpdate(12, "boom"));
    assert.equal(answer.status, 200);
    assert.equal((harness.caught[0] as Error).message, "boom");
  });

  test(`${framework}: 401 on a bad signature or secret token, and nothing runs`, async () => {
    const { url, harness, sent } = await setUp(make);
    const other = "whsec_QWxsIHRoZSBvdGhlciBzZWNyZXQgYnl0ZXM=";
    const forged = await forward(url, textUpdate(12, "sleep:1"), SHOP, { secret: other });
    assert.equal(forged.status, 401);
    assert.deepEqual(forged.body, { error: "webhook-signature does not match" });
    const token = await forward(url, textUpdate(12, "sleep:1"), SHOP, { token: "guess" });
    assert.equal(token.status, 401);
    assert.deepEqual(harness.ran, []);
    assert.equal(sent().length, 0);
  });

  test(`${framework}: ctx.intake is the identity headers, undefined for a plain request`, async () => {
    const { url, harness } = await setUp(make);
    assert.equal((await forward(url, textUpdate(12, "intake"))).status, 200);
    assert.equal((await forward(url, textUpdate(13, "intake"), null)).status, 200);
    const [withIdentity, plain] = harness.seen;
    assert.deepEqual(withIdentity?.intake?.identity, SHOP);
    assert.equal(withIdentity?.intake?.key, "shop:12");
    assert.equal(withIdentity?.intake?.fenceToken?.receivedAt, 1_796_126_400_123);
    assert.equal(withIdentity?.intake?.leaseExpiresAt, 1_796_126_467_000);
    assert.equal(withIdentity?.current, withIdentity?.intake);
    assert.equal(plain?.intake, undefined);
    assert.equal(plain?.current, undefined);
  });

  test(`${framework}: ctx.intake.owns() asks the callback API, or says what it needs`, async () => {
    const connected = await setUp(make, { withIntake: true });
    assert.equal((await forward(connected.url, textUpdate(12, "intake:owns"))).status, 200);
    assert.equal(connected.harness.seen[0]?.owns, true);
    assert.equal(connected.called("/v1/claims/owns")[0]?.body["claim_id"], "claim-1");
    const alone = await setUp(make);
    const answer = await forward(alone.url, textUpdate(12, "intake:owns"));
    assert.equal(answer.status, 500);
    assert.match(String(answer.body["error"]), /owns\(\) needs intakeUrl and apiKey/);
  });
}

export function deferralSuite(framework: string, make: MakeBot): void {
  const deferred: SetUp = {
    withIntake: true,
    options: { deferAfter: 0.2, deferredLeaseSeconds: 1.2 }, // renews every 0.4 s
  };

  test(`${framework}: a slow handler is answered 202, renewed, then settled completed`, async () => {
    const { url, sent, called } = await setUp(make, deferred);
    const started = Date.now();
    const answer = await forward(url, textUpdate(12, "sleep:1000"));
    assert.equal(answer.status, 202);
    assert.deepEqual(answer.body, { deferred: true });
    assert.ok(answer.at - started < 700, "answered at deferAfter, not after the handler");
    assert.equal(sent().length, 0);
    await eventually(() => called("/settle").length > 0);
    const renews = called("/renew");
    assert.ok(renews.length >= 2, `renewed every 0.4 s, ${renews.length} times`);
    assert.ok(renews.every((call) => call.body["lease_ms"] === 1200));
    assert.ok((renews[0]?.at ?? Infinity) - answer.at < 300, "the first renew at once");
    const [settle] = called("/settle");
    assert.deepEqual(settle?.body, { ...snake(), outcome: "completed" });
    assert.ok((sent()[0]?.at ?? Infinity) <= (settle?.at ?? 0), "settled after the work");
    await sleep(300);
    assert.equal(called("/renew").length, renews.length, "no renew after the settle");
  });

  test(`${framework}: a TerminalError after the 202 settles exhausted`, async () => {
    const { url, called } = await setUp(make, deferred);
    assert.equal((await forward(url, textUpdate(12, "late-terminal:500"))).status, 202);
    await eventually(() => called("/settle").length > 0);
    assert.deepEqual(called("/settle")[0]?.body, {
      ...snake(),
      outcome: "exhausted",
      error: "late terminal",
    });
  });

  test(`${framework}: another error after the 202 settles failed`, async () => {
    const { url, called } = await setUp(make, deferred);
    assert.equal((await forward(url, textUpdate(12, "late-boom:500"))).status, 202);
    await eventually(() => called("/settle").length > 0);
    assert.deepEqual(called("/settle")[0]?.body, {
      ...snake(),
      outcome: "failed",
      error: "Error: late boom",
    });
  });

  test(`${framework}: renewed false stops renewing, and nothing is settled`, async () => {
    const { url, called, logged, sent } = await setUp(make, {
      ...deferred,
      answers: { "/v1/claims/renew": { body: { renewed: false, lease_expires_at: null } } },
    });
    assert.equal((await forward(url, textUpdate(12, "sleep:800"))).status, 202);
    await eventually(() => sent().length > 0);
    await sleep(200);
    assert.equal(called("/renew").length, 1);
    assert.equal(called("/settle").length, 0);
    assert.equal(logged.seen.filter((line) => line.includes("lost its lease")).length, 1);
  });

  test(`${framework}: a handler done before deferAfter is answered as usual`, async () => {
    const { url, called } = await setUp(make, deferred);
    assert.equal((await forward(url, textUpdate(12, "sleep:20"))).status, 200);
    assert.equal((await forward(url, textUpdate(12, "terminal"))).status, 422);
    assert.equal(called("/").length, 0);
  });

  test(`${framework}: a plain request is never deferred`, async () => {
    const { url, called } = await setUp(make, deferred);
    assert.equal((await forward(url, textUpdate(12, "sleep:400"), null)).status, 200);
    assert.equal(called("/").length, 0);
  });
}

function snake(): Record<string, unknown> {
  return { bot: SHOP.bot, update_id: 12, attempt: SHOP.attempt, claim_id: SHOP.claimId };
}
