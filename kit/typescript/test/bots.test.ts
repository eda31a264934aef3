/**
 * The test bots the Python end-to-end tests start (dist-test/test/bots/*.js), run
 * here as those tests run them: a process configured by its environment.
 */

import { after, describe, test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import http from "node:http";
import type { AddressInfo } from "node:net";
import path from "node:path";
import {
  fakeBotApi,
  fakeIntake,
  forward,
  noUnhandledRejections,
  SHOP,
  SIGNING,
  textUpdate,
  TOKEN,
  eventually,
} from "./helpers";

noUnhandledRejections();

async function freePort(): Promise<number> {
  const probe = http.createServer();
  await new Promise<void>((resolve) => probe.listen(0, "127.0.0.1", resolve));
  const { port } = probe.address() as AddressInfo;
  await new Promise((resolve) => probe.close(resolve));
  return port;
}

/** Start one bot; resolves once it said "listening on PORT". */
async function start(name: string, env: Record<string, string>): Promise<string> {
  const port = await freePort();
  const child = spawn(process.execPath, [path.join(__dirname, "bots", `${name}.js`)], {
    env: { ...process.env, ...env, PORT: String(port) },
    stdio: ["ignore", "pipe", "pipe"],
  });
  after(() => {
    child.kill();
  });
  let output = "";
  await new Promise<void>((resolve, reject) => {
    child.stdout.on("data", (chunk: Buffer) => {
      output += chunk.toString();
      if (output.includes(`listening on ${port}\n`)) resolve();
    });
    child.stderr.resume();
    child.on("exit", (code) => reject(new Error(`${name} exited with ${code}: ${output}`)));
  });
  return `http://127.0.0.1:${port}`;
}

for (const name of ["grammy", "telegraf"]) {
  describe(`the ${name} test bot`, () => {
    test("answers with what it saw, fails attempt 1 of fail-once, and is terminal", async () => {
      const api = await fakeBotApi();
      const intake = await fakeIntake();
      const url = await start(name, {
        BOT_TOKEN: "123:abc",
        BOT_API_ROOT: api.root,
        SECRET_TOKEN: TOKEN,
        SIGNING_SECRET: SIGNING,
        INTAKE_URL: intake.url,
        API_KEY: "key-1",
      });
      const sent = () =>
        api.calls
          .filter((call) => call.method === "sendMessage")
          .map((call) => [call.body["chat_id"], JSON.parse(String(call.body["text"]))]);
      assert.equal((await forward(url, textUpdate(12, "hello"))).status, 200);
      assert.deepEqual(sent(), [
        [
          42,
          {
            update_id: 12,
            text: "hello",
            intake: { bot: "shop", update_id: 12, attempt: 1, claim_id: "claim-1", owns: true },
          },
        ],
      ]);
      assert.equal((await forward(url, textUpdate(12, "fail-once"))).status, 500);
      assert.equal(
        (await forward(url, textUpdate(12, "fail-once"), { ...SHOP, attempt: 2 })).status,
        200,
      );
      assert.equal((await forward(url, textUpdate(12, "terminal"))).status, 422);
      assert.equal((await forward(url, textUpdate(13, "plain"), null)).status, 200);
      assert.deepEqual(sent().slice(1), [
        [
          42,
          {
            update_id: 12,
            text: "fail-once",
            intake: { bot: "shop", update_id: 12, attempt: 2, claim_id: "claim-1", owns: true },
          },
        ],
        [42, { update_id: 13, text: "plain", intake: null }],
      ]);
      assert.equal(api.calls.filter((call) => call.method === "getMe").length, 1);
    });

    test("defers a slow update after DEFER_AFTER and settles it", async () => {
      const api = await fakeBotApi();
      const intake = await fakeIntake();
      const url = await start(name, {
        BOT_TOKEN: "123:abc",
        BOT_API_ROOT: api.root,
        SIGNING_SECRET: SIGNING,
        INTAKE_URL: intake.url,
        API_KEY: "key-1",
        DEFER_AFTER: "0.2",
      });
      assert.equal((await forward(url, textUpdate(12, "sleep:600"))).status, 202);
      await eventually(() => intake.calls.some((call) => call.path === "/v1/claims/settle"));
      const settle = intake.calls.find((call) => call.path === "/v1/claims/settle");
      assert.equal(settle?.body["outcome"], "completed");
      assert.ok(intake.calls.some((call) => call.path === "/v1/claims/renew"));
    });
  });
}
