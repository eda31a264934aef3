/** intakeHandler with the real grammY, against a fake Bot API. */

import { test } from "node:test";
import assert from "node:assert/strict";
import { Bot, type Context } from "grammy";
import { intakeHandler, type IntakeFlavor } from "../src/index";
import {
  BOT_TOKEN,
  fakeBotApi,
  forward,
  noUnhandledRejections,
  serve,
  SIGNING,
  textUpdate,
} from "./helpers";
import { behave, deferralSuite, handlerSuite, type Harness, type MakeBot } from "./suite";

noUnhandledRejections();

const makeGrammy: MakeBot = (apiRoot, { catchAll }) => {
  // No botInfo: grammY initialises through getMe on the fake API.
  const bot = new Bot<Context & IntakeFlavor>(BOT_TOKEN, { client: { apiRoot } });
  const harness: Harness = { bot, ran: [], seen: [], caught: [] };
  bot.on("message:text", (ctx) => behave(ctx.message.text, ctx, harness));
  if (catchAll) bot.catch((error) => void harness.caught.push(error.error));
  return harness;
};

handlerSuite("grammY", makeGrammy);
deferralSuite("grammY", makeGrammy);

test("grammY: concurrent first requests initialise the bot with one getMe", async () => {
  const api = await fakeBotApi();
  const { bot } = makeGrammy(api.root, { catchAll: false });
  const served = await serve(intakeHandler(bot, { signingSecret: SIGNING }));
  const answers = await Promise.all(
    [1, 2, 3].map((n) => forward(served.url, textUpdate(n, "sleep:10"), null)),
  );
  assert.deepEqual(
    answers.map((answer) => answer.status),
    [200, 200, 200],
  );
  assert.equal(api.calls.filter((call) => call.method === "getMe").length, 1);
});

test("grammY: a failed getMe answers 500, and the next request tries again", async () => {
  const api = await fakeBotApi();
  const bot = makeGrammy(api.root, { catchAll: false }).bot as Bot;
  // grammY retries getMe on network errors only; a refused token is an API error, at once.
  let refuse = true;
  bot.api.config.use((prev, method, payload, signal) =>
    method === "getMe" && refuse
      ? Promise.reject(new Error("getMe refused"))
      : prev(method, payload, signal),
  );
  const served = await serve(intakeHandler(bot, { signingSecret: SIGNING }));
  const first = await forward(served.url, textUpdate(1, "sleep:1"), null);
  assert.equal(first.status, 500);
  refuse = false;
  assert.equal((await forward(served.url, textUpdate(2, "sleep:1"), null)).status, 200);
});
