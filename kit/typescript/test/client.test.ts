/** IntakeClient against a node:http fake of the callback API. */

import { test } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { CallbackError, IntakeClient } from "../src/index";
import { fakeIntake, LEASE, noUnhandledRejections, SHOP } from "./helpers";

noUnhandledRejections();

test("each call posts snake_case JSON with the bearer key to its path", async () => {
  const intake = await fakeIntake();
  const client = new IntakeClient(`${intake.url}/`, "key-1");
  assert.deepEqual(await client.owns(SHOP), { owned: true, leaseExpiresAt: LEASE });
  assert.deepEqual(await client.renew(SHOP, 30_000), { renewed: true, leaseExpiresAt: LEASE });
  assert.deepEqual(await client.renew(SHOP), { renewed: true, leaseExpiresAt: LEASE });
  assert.deepEqual(await client.settle(SHOP, "failed", { error: "E: x", retryAfterMs: 5000 }), {
    settled: true,
  });
  assert.deepEqual(await client.settle(SHOP, "completed"), { settled: true });
  assert.deepEqual(await client.acknowledge(SHOP), { acknowledged: true });
  const identity = '"bot":"shop","update_id":12,"attempt":1,"claim_id":"claim-1"';
  assert.deepEqual(
    intake.calls.map((call) => [call.path, call.raw]),
    [
      ["/v1/claims/owns", `{${identity}}`],
      ["/v1/claims/renew", `{${identity},"lease_ms":30000}`],
      ["/v1/claims/renew", `{${identity}}`],
      [
        "/v1/claims/settle",
        `{${identity},"outcome":"failed","error":"E: x","retry_after_ms":5000}`,
      ],
      ["/v1/claims/settle", `{${identity},"outcome":"completed"}`],
      ["/v1/exhaustions/acknowledge", `{${identity}}`],
    ],
  );
  assert.ok(intake.calls.every((call) => call.authorization === "Bearer key-1"));
});

test("a destination other than default is sent back; default is left out", async () => {
  const intake = await fakeIntake();
  const client = new IntakeClient(intake.url, "key-1");
  await client.owns({ ...SHOP, destination: "payments" });
  await client.settle({ ...SHOP, destination: "payments" }, "completed");
  await client.owns({ bot: "shop", updateId: 12, attempt: 1, claimId: "claim-1" });
  const identity = '"bot":"shop","update_id":12,"attempt":1,"claim_id":"claim-1"';
  assert.deepEqual(
    intake.calls.map((call) => call.raw),
    [
      `{${identity},"destination":"payments"}`,
      `{${identity},"destination":"payments","outcome":"completed"}`,
      `{${identity}}`, // a service from before destinations takes it as it always did
    ],
  );
  await assert.rejects(client.owns({ ...SHOP, destination: "Payments" }), /identity invalid/);
  assert.equal(intake.calls.length, 3);
});

test("an update_id past 2**53 is sent exact", async () => {
  const intake = await fakeIntake();
  const client = new IntakeClient(intake.url, "key-1");
  await client.owns({ ...SHOP, updateId: "9223372036854775807" });
  await client.owns({ ...SHOP, updateId: 9007199254740993n });
  assert.match(intake.calls[0]?.raw ?? "", /"update_id":9223372036854775807,/);
  assert.match(intake.calls[1]?.raw ?? "", /"update_id":9007199254740993,/);
});

test("an answer that is not 2xx throws CallbackError with the service's error", async () => {
  const intake = await fakeIntake({
    "/v1/claims/owns": { status: 401, body: { error: "unknown api key" } },
    "/v1/claims/renew": { status: 503, body: "overloaded" },
  });
  const client = new IntakeClient(intake.url, "wrong");
  await assert.rejects(client.owns(SHOP), (error: unknown) => {
    assert.ok(error instanceof CallbackError);
    assert.equal(error.status, 401);
    assert.equal(error.detail, "unknown api key");
    assert.equal(error.message, "401: unknown api key");
    return true;
  });
  await assert.rejects(client.renew(SHOP), { name: "CallbackError", status: 503 });
  assert.equal(intake.calls.length, 2, "an HTTP answer is never retried");
});

test("a request the service would refuse fails before it is sent", async () => {
  const intake = await fakeIntake();
  const client = new IntakeClient(intake.url, "key-1");
  await assert.rejects(
    client.owns({ ...SHOP, bot: "Shop" }),
    /identity invalid: String should match/,
  );
  await assert.rejects(client.owns({ ...SHOP, attempt: 0 }), /greater than or equal to 1/);
  await assert.rejects(client.owns({ ...SHOP, updateId: 2 ** 60 }), /valid integer/);
  await assert.rejects(client.renew(SHOP, 0), /lease_ms invalid/);
  await assert.rejects(client.settle(SHOP, "completed", { error: "x" }), /error is for outcomes/);
  await assert.rejects(client.settle(SHOP, "exhausted", { retryAfterMs: 1 }), /failed' only/);
  await assert.rejects(client.settle(SHOP, "failed", { error: "x".repeat(2001) }), /at most 2000/);
  await assert.rejects(client.settle(SHOP, "failed", { error: "a\0b" }), /pattern/);
  assert.equal(intake.calls.length, 0);
});

test("a connection failure is retried twice, then thrown", async () => {
  let tries = 0;
  const failing: typeof fetch = async () => {
    tries += 1;
    throw new TypeError("fetch failed");
  };
  const client = new IntakeClient("http://127.0.0.1:9", "key-1", { fetch: failing });
  await assert.rejects(client.owns(SHOP), TypeError);
  assert.equal(tries, 3);
});

test("a connection refused once, then accepted, succeeds", async () => {
  // A port nobody listens on at first: the first try is refused, the retry finds the server.
  const probe = http.createServer();
  await new Promise<void>((resolve) => probe.listen(0, "127.0.0.1", resolve));
  const { port } = probe.address() as AddressInfo;
  await new Promise((resolve) => probe.close(resolve));
  const server = http.createServer((req, res) => {
    req.resume();
    res.writeHead(200, { "content-type": "application/json" });
    res.end('{"owned":false,"lease_expires_at":null}');
  });
  const client = new IntakeClient(`http://127.0.0.1:${port}`, "key-1");
  const answer = client.owns(SHOP);
  setTimeout(() => server.listen(port, "127.0.0.1"), 30);
  assert.deepEqual(await answer, { owned: false, leaseExpiresAt: null });
  server.closeAllConnections();
  await new Promise((resolve) => server.close(resolve));
});

test("a timeout is thrown, not retried", async () => {
  const server = http.createServer(() => undefined); // never answers
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  const client = new IntakeClient(`http://127.0.0.1:${port}`, "key-1", { timeoutMs: 100 });
  await assert.rejects(client.owns(SHOP), { name: "TimeoutError" });
  server.closeAllConnections();
  await new Promise((resolve) => server.close(resolve));
});
