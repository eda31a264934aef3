/**
 * The Standard Webhooks signature, as the service signs: `v1,` + base64 of
 * HMAC-SHA256 over `{message id}.{timestamp}.{body}`, keyed with the decoded
 * base64 of a `whsec_...` secret.
 *
 * Written on node:crypto (no runtime dependency); the tests check it against the
 * `standardwebhooks` npm package and against the Python kit's `sign`, through the
 * shared vectors in kit/vectors/signatures.json.
 */

import { createHmac, timingSafeEqual } from "node:crypto";

const SECRET_PREFIX = "whsec_";
// What Python's `base64.b64decode(..., validate=True)` accepts: the alphabet,
// at most two `=` at the end, and whole 4-character groups.
const STRICT_BASE64 = /^[A-Za-z0-9+/]*={0,2}$/;

/** The HMAC key of a `whsec_...` secret (the prefix is optional, as in the Python kit). */
export function signingKey(secret: string): Buffer {
  const encoded = secret.startsWith(SECRET_PREFIX) ? secret.slice(SECRET_PREFIX.length) : secret;
  if (!STRICT_BASE64.test(encoded) || encoded.length % 4 !== 0) {
    throw new TypeError("a signing secret is whsec_ and base64");
  }
  return Buffer.from(encoded, "base64");
}

/** A whole number as Python's `f"{n}"` writes it: no exponent, no leading zeros. */
export function decimal(value: number | bigint): string {
  if (typeof value === "number" && !Number.isInteger(value)) {
    throw new TypeError(`a timestamp is a whole number of seconds, not ${value}`);
  }
  return BigInt(value).toString();
}

/** The `webhook-signature` value for one message: `v1,<base64 HMAC-SHA256>`. */
export function sign(
  secret: string,
  messageId: string,
  timestamp: number | bigint,
  body: Uint8Array | string,
): string {
  const hmac = createHmac("sha256", signingKey(secret));
  hmac.update(`${messageId}.${decimal(timestamp)}.`, "utf8");
  hmac.update(typeof body === "string" ? Buffer.from(body, "utf8") : body);
  return `v1,${hmac.digest("base64")}`;
}

/**
 * Whether two strings are equal, in time that does not depend on where they
 * differ (only on their lengths, as Python's `hmac.compare_digest`).
 */
export function safeEqual(given: string, expected: string): boolean {
  const a = Buffer.from(given, "utf8");
  const b = Buffer.from(expected, "utf8");
  return a.length === b.length && timingSafeEqual(a, b);
}

// Python's `str.split()` with no argument: runs of these characters separate,
// and empty pieces are dropped. (JavaScript's \s differs: it has U+FEFF and lacks
// U+001C..U+001F and U+0085.)
const PYTHON_WHITESPACE =
  /[\t\n\v\f\r\x1c-\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+/;

/** The signatures of one header: several, space-separated, while a secret is rotated. */
export function splitSignatures(header: string): string[] {
  return header.split(PYTHON_WHITESPACE).filter((piece) => piece !== "");
}

/** Whether any of a header's signatures is `expected`. */
export function anySignatureMatches(header: string, expected: string): boolean {
  // Every candidate is compared (no early exit), as the Python kit does.
  let matched = false;
  for (const given of splitSignatures(header)) {
    matched = safeEqual(given, expected) || matched;
  }
  return matched;
}
