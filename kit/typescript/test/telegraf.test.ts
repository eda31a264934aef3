/** intakeHandler with the real Telegraf, against a fake Bot API. */

import { test } from "node:test";
import assert from "node:assert/strict";
import { Telegraf, type Context } from "telegraf";
import { message } from "telegraf/filters";
import { intakeHandler, type IntakeFlavor } from "../src/index";
import {
  BOT_TOKEN,
  fakeBotApi,
  forward,
  lines,
  noUnhandledRejections,
  serve,
  SIGNING,
  textUpdate,
} from "./helpers";
import { behave, deferralSuite, handlerSuite, type Harness, type MakeBot } from "./suite";

noUnhandledRejections();

const makeTelegraf: MakeBot = (apiRoot, { catchAll }) => {
  const bot = new Telegraf<Context & IntakeFlavor>(BOT_TOKEN, {
    telegram: { apiRoot },
    handlerTimeout: Infinity,
  });
  const harness: Harness = { bot, ran: [], seen: [], caught: [] };
  bot.on(message("text"), (ctx) => behave(ctx.message.text, ctx, harness));
  if (catchAll) bot.catch((error) => void harness.caught.push(error));
  return harness;
};

handlerSuite("Telegraf", makeTelegraf);
deferralSuite("Telegraf", makeTelegraf);

test("Telegraf: process.exitCode is untouched after a handler error", async () => {
  const before = process.exitCode;
  const api = await fakeBotApi();
  const { bot } = makeTelegraf(api.root, { catchAll: false });
  const served = await serve(intakeHandler(bot, { signingSecret: SIGNING }));
  assert.equal((await forward(served.url, textUpdate(1, "boom"), null)).status, 500);
  assert.equal(process.exitCode, before);
});

test("Telegraf: bot.catch after intakeHandler still sees errors, and Terminal still wins", async () => {
  const api = await fakeBotApi();
  const harness = makeTelegraf(api.root, { catchAll: false });
  const served = await serve(intakeHandler(harness.bot, { signingSecret: SIGNING }));
  (harness.bot as Telegraf).catch((error) => void harness.caught.push(error));
  assert.equal((await forward(served.url, textUpdate(1, "boom"), null)).status, 200);
  assert.equal((await forward(served.url, textUpdate(2, "terminal"), null)).status, 422);
  assert.equal(harness.caught.length, 2);
});

test("Telegraf: a finite handlerTimeout with deferral is warned about", () => {
  const bot = new Telegraf(BOT_TOKEN);
  const logged = lines();
  intakeHandler(bot, {
    secretToken: "t",
    intakeUrl: "http://127.0.0.1:9",
    apiKey: "k",
    log: logged.log,
  });
  assert.match(logged.seen[0] ?? "", /handlerTimeout \(90000 ms\).*Infinity/);
});
