/**
 * The shared vectors (kit/vectors/signatures.json, made by the Python kit):
 * readForwarded does what the Python read_forwarded does with each case, `sign`
 * signs as the Python `sign`, and the npm `standardwebhooks` package agrees with
 * each case's `standard` flag.
 */

import { test, describe } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import path from "node:path";
import { Webhook } from "standardwebhooks";
import { readForwarded, Rejected, sign, signingKey } from "../src/index";
import { formatG } from "../src/forwarded";

interface Case {
  name: string;
  secret: string;
  secret_token?: string;
  headers: Record<string, string>;
  body?: string;
  body_base64?: string;
  now: number;
  sign?: string;
  standard?: boolean;
  expect: "ok" | "rejected";
  reason?: string;
  identity?: {
    bot: string;
    update_id: string;
    attempt: number;
    claim_id: string;
    destination: string;
  } | null;
  update_id?: string;
  received_at?: number | null;
  lease_expires_at?: number | null;
}

const FILE = path.resolve(__dirname, "../../../vectors/signatures.json");
const cases = JSON.parse(readFileSync(FILE, "utf8")) as Case[];

function bodyOf(item: Case): Buffer {
  return item.body_base64 !== undefined
    ? Buffer.from(item.body_base64, "base64")
    : Buffer.from(item.body as string, "utf8");
}

function read(item: Case): ReturnType<typeof readForwarded> {
  return readForwarded(item.headers, bodyOf(item), {
    signingSecret: item.secret,
    secretToken: item.secret_token,
    now: item.now,
  });
}

test("the vectors are there", () => {
  assert.ok(cases.length >= 25);
});

describe("readForwarded agrees with the Python kit", () => {
  for (const item of cases) {
    test(item.name, () => {
      if (item.expect === "rejected") {
        assert.throws(
          () => read(item),
          (error: unknown) =>
            error instanceof Rejected && error.message.includes(item.reason as string),
        );
        return;
      }
      const forwarded = read(item);
      const identity =
        forwarded.identity === undefined
          ? null
          : {
              bot: forwarded.identity.bot,
              update_id: forwarded.identity.updateId,
              attempt: forwarded.identity.attempt,
              claim_id: forwarded.identity.claimId,
              destination: forwarded.identity.destination,
            };
      assert.deepEqual(identity, item.identity);
      assert.equal(forwarded.updateId, item.update_id);
      assert.equal(forwarded.receivedAt ?? null, item.received_at);
      assert.equal(forwarded.leaseExpiresAt ?? null, item.lease_expires_at);
      assert.deepEqual(Buffer.from(forwarded.body), bodyOf(item));
      assert.equal(forwarded.fenceToken?.receivedAt ?? null, identity ? item.received_at : null);
    });
  }
});

describe("sign agrees with the Python kit", () => {
  for (const item of cases.filter((each) => each.sign !== undefined)) {
    test(item.name, () => {
      const stamp = BigInt(item.headers["webhook-timestamp"] as string);
      const id = item.headers["webhook-id"] as string;
      assert.equal(sign(item.secret, id, stamp, bodyOf(item)), item.sign);
    });
  }
});

describe("the npm standardwebhooks package agrees with the standard flag", () => {
  for (const item of cases.filter((each) => each.standard !== undefined)) {
    test(item.name, () => {
      // The package reads Date.now() and has no option for it: the case's now, for one call.
      const realNow = Date.now;
      Date.now = () => item.now * 1000;
      try {
        const verify = (): unknown =>
          new Webhook(item.secret).verify(bodyOf(item), item.headers, { jsonParse: false });
        if (item.standard) verify();
        else assert.throws(verify, { name: "WebhookVerificationError" });
      } finally {
        Date.now = realNow;
      }
    });
  }
});

test("signingKey refuses what Python's strict base64 refuses", () => {
  // The table Python's base64.b64decode(..., validate=True) gives.
  const accepted: Record<string, string> = {
    "": "",
    "QQ==": "A",
    "QUI=": "AB",
    QUJD: "ABC",
    "QR==": "A",
  };
  for (const [encoded, decoded] of Object.entries(accepted)) {
    assert.equal(signingKey(`whsec_${encoded}`).toString("latin1"), decoded, encoded);
  }
  for (const encoded of ["Q", "QQ", "QQ=", "QUI", "QUI==", "QUJDR", "=", "Q===", "QU I=", "QUI_"]) {
    assert.throws(() => signingKey(`whsec_${encoded}`), /whsec_ and base64/, encoded);
  }
});

test("formatG writes numbers as Python's format(x, 'g')", () => {
  const expected: [number, string][] = [
    [300, "300"],
    [0.5, "0.5"],
    [1e6, "1e+06"],
    [123456, "123456"],
    [1234567, "1.23457e+06"],
    [0.0001, "0.0001"],
    [0.00001, "1e-05"],
    [2.5, "2.5"],
    [0, "0"],
  ];
  for (const [value, text] of expected) assert.equal(formatG(value), text, String(value));
});

test("readForwarded takes header names in any case, Headers, and arrays", () => {
  const item = cases.find((each) => each.name === "identity request") as Case;
  const titled = Object.fromEntries(
    Object.entries(item.headers).map(([name, value]) => [name.toUpperCase(), value]),
  );
  const options = { signingSecret: item.secret, now: item.now };
  assert.equal(readForwarded(titled, bodyOf(item), options).identity?.attempt, 3);
  assert.equal(
    readForwarded(new Headers(item.headers), bodyOf(item), options).identity?.bot,
    "shop",
  );
  const listed = {
    ...item.headers,
    "webhook-signature": [item.headers["webhook-signature"] as string],
  };
  assert.equal(readForwarded(listed, bodyOf(item), options).updateId, "12");
  // Python's str.split(): any whitespace run separates rotated signatures.
  const tabbed = {
    ...item.headers,
    "webhook-signature": `v1,AAAA\t${item.headers["webhook-signature"]}`,
  };
  assert.equal(readForwarded(tabbed, bodyOf(item), options).updateId, "12");
});

test("readForwarded needs a secret, and reads a secret token alone", () => {
  const item = cases.find((each) => each.name === "identity request") as Case;
  assert.throws(() => readForwarded(item.headers, bodyOf(item), {}), TypeError);
  const forwarded = readForwarded(item.headers, bodyOf(item), { secretToken: "behind-the-intake" });
  assert.equal(forwarded.identity?.claimId, "2b0f6f0e-claim");
  assert.throws(
    () => readForwarded(item.headers, bodyOf(item), { signingSecret: item.secret }),
    /more than 300 s away/,
  );
});
