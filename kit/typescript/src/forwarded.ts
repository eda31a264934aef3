/**
 * Reading a request the service forwarded downstream: verify it, then take the
 * update and the attempt's identity from it. A port of the Python kit's
 * `read_forwarded`: the same checks, in the same order, with the same reasons.
 *
 * Verification is the downstream secret (`X-Telegram-Bot-Api-Secret-Token`,
 * what an unmodified bot framework checks), or a Standard Webhooks signature
 * over `webhook-id`, `webhook-timestamp` and the body within a tolerance, or
 * both. `webhook-id` is `bot:update_id`: the kit checks that it agrees with the
 * identity headers (or, for a plain bot, names the body's update), so a signed
 * request cannot be replayed for another update, nor another signed message
 * (an exhaustion record) pass for an update. `X-Intake-Identity-Signature` signs
 * the identity headers and `X-Intake-Received-At` (the fencing token), so
 * nobody who can alter headers in flight can advance a stale attempt's token.
 */

import type { IncomingHttpHeaders } from "node:http";
import {
  DEFAULT_DESTINATION,
  identityKey,
  identityMessage,
  identityProblem,
  isDigits,
  BOT_PATTERN,
  MAX_BIGINT,
  type Identity,
} from "./identity";
import { anySignatureMatches, safeEqual, sign } from "./signature";
import { readUpdate, type Update } from "./update";

export const DEFAULT_TOLERANCE_SECONDS = 300;
const IDENTITY_SIGNATURE_HEADER = "x-intake-identity-signature";
/** Absent (a service from before destinations): `default`. */
const DESTINATION_HEADER = "x-intake-destination";
const IDENTITY_HEADERS = {
  bot: "x-intake-bot",
  updateId: "x-intake-update-id",
  attempt: "x-intake-attempt",
  claimId: "x-intake-claim-id",
} as const;

/** The request did not come from the service, or is not one it would send. */
export class Rejected extends Error {
  /** 400 when the verified body is no update; 401 when the request is not the service's. */
  readonly status: 400 | 401;

  constructor(reason: string, status: 400 | 401 = 401) {
    super(reason);
    this.name = "Rejected";
    this.status = status;
  }
}

/**
 * What orders the attempts of one update (the Python kit's fence): the attempt
 * number grows with every claim, `receivedAt` with every recording of the update.
 */
export interface FenceToken {
  readonly identity: Identity;
  readonly receivedAt: number;
}

/** One verified attempt. `identity` is undefined for a plain bot's bare update. */
export interface Forwarded {
  readonly identity: Identity | undefined;
  /** When the lease ends (epoch ms), if the service said. */
  readonly leaseExpiresAt: number | undefined;
  /** When the service recorded the update (epoch ms), if it said. */
  readonly receivedAt: number | undefined;
  /** The parsed body, as a bot framework's `handleUpdate` takes it. */
  readonly update: Update;
  /** The body's `update_id`, exact, as decimal digits. */
  readonly updateId: string;
  /** The bytes as received. */
  readonly body: Uint8Array;
  /** Undefined for a plain bot, or without `X-Intake-Received-At`: such a request passes no fence. */
  readonly fenceToken: FenceToken | undefined;
}

/** Node's `req.headers`, a fetch `Headers`, or any record of header names to values. */
export type HeadersLike =
  IncomingHttpHeaders | Headers | Readonly<Record<string, string | readonly string[] | undefined>>;

export interface ReadOptions {
  /** The bot's `signing_secret` (`whsec_...`). */
  signingSecret?: string;
  /** The bot's `downstream_secret_token`. */
  secretToken?: string;
  toleranceSeconds?: number;
  /** Now, in epoch seconds (default: the clock). */
  now?: number;
}

/**
 * Verify a forwarded request and read it; throws `Rejected` with the reason.
 * Give the bot's `signingSecret`, its `secretToken`, or both: every one given must match.
 */
export function readForwarded(
  headers: HeadersLike,
  body: Uint8Array | string,
  options: ReadOptions,
): Forwarded {
  const { signingSecret, secretToken } = options;
  const tolerance = options.toleranceSeconds ?? DEFAULT_TOLERANCE_SECONDS;
  if (signingSecret === undefined && secretToken === undefined) {
    throw new TypeError("give signingSecret or secretToken: an unverified request proves nothing");
  }
  const bytes = typeof body === "string" ? Buffer.from(body, "utf8") : body;
  const lower = lowerCased(headers);
  if (secretToken !== undefined) {
    if (!safeEqual(lower.get("x-telegram-bot-api-secret-token") ?? "", secretToken)) {
      throw new Rejected("missing or wrong X-Telegram-Bot-Api-Secret-Token");
    }
  }
  if (signingSecret !== undefined) {
    verifySignature(lower, bytes, signingSecret, tolerance, options.now ?? Date.now() / 1000);
  }
  const reading = readUpdate(bytes);
  if (!reading.ok) throw new Rejected(reading.reason, 400);
  const identity = readIdentity(lower);
  if (identity !== undefined && identity.updateId !== reading.updateId) {
    throw new Rejected("X-Intake-Update-Id does not match the body's update_id");
  }
  const receivedAt = millis(lower, "x-intake-received-at", "X-Intake-Received-At");
  if (signingSecret !== undefined) {
    checkMessageId(lower.get("webhook-id") as string, identity, reading.updateId);
    if (identity !== undefined) checkIdentitySignature(lower, identity, receivedAt, signingSecret);
  }
  const lease = millis(lower, "x-intake-lease-expires-at", "X-Intake-Lease-Expires-At");
  const received = receivedAt === undefined ? undefined : Number(receivedAt);
  return {
    identity,
    leaseExpiresAt: lease === undefined ? undefined : Number(lease),
    receivedAt: received,
    update: reading.update,
    updateId: reading.updateId,
    body: bytes,
    fenceToken:
      identity === undefined || received === undefined
        ? undefined
        : { identity, receivedAt: received },
  };
}

/** Header names lower-cased; a repeated header's values joined as Node joins them. */
function lowerCased(headers: HeadersLike): Map<string, string> {
  const lower = new Map<string, string>();
  const add = (name: string, value: string | readonly string[] | undefined): void => {
    if (value !== undefined) lower.set(name.toLowerCase(), join(value));
  };
  if (typeof Headers !== "undefined" && headers instanceof Headers) {
    headers.forEach((value, name) => add(name, value));
  } else {
    for (const [name, value] of Object.entries(headers)) add(name, value);
  }
  return lower;
}

function join(value: string | readonly string[]): string {
  return typeof value === "string" ? value : value.join(", ");
}

function verifySignature(
  headers: Map<string, string>,
  body: Uint8Array,
  secret: string,
  tolerance: number,
  now: number,
): void {
  const messageId = headers.get("webhook-id");
  const stamp = headers.get("webhook-timestamp") ?? "";
  const signatures = headers.get("webhook-signature");
  if (!messageId || !signatures || !isDigits(stamp)) {
    throw new Rejected("missing webhook-id, webhook-timestamp or webhook-signature");
  }
  if (Math.abs(now - Number(stamp)) > tolerance) {
    throw new Rejected(`webhook-timestamp is more than ${formatG(tolerance)} s away from now`);
  }
  // Several space-separated signatures may be sent while a secret is rotated.
  if (!anySignatureMatches(signatures, sign(secret, messageId, BigInt(stamp), body))) {
    throw new Rejected("webhook-signature does not match");
  }
}

function readIdentity(headers: Map<string, string>): Identity | undefined {
  const names = Object.entries(IDENTITY_HEADERS) as [keyof typeof IDENTITY_HEADERS, string][];
  const present = names.filter(([, header]) => headers.has(header));
  if (present.length === 0) return undefined; // a plain bot's request
  if (present.length < names.length) {
    const missing = names.filter(([, header]) => !headers.has(header)).map(([, header]) => header);
    throw new Rejected(`identity headers missing: ${missing.join(", ")}`);
  }
  const fields = {
    bot: headers.get(IDENTITY_HEADERS.bot),
    updateId: headers.get(IDENTITY_HEADERS.updateId),
    attempt: headers.get(IDENTITY_HEADERS.attempt),
    claimId: headers.get(IDENTITY_HEADERS.claimId),
    destination: headers.get(DESTINATION_HEADER) ?? DEFAULT_DESTINATION,
  };
  const problem = identityProblem(fields);
  if (problem !== undefined) throw new Rejected(`identity headers invalid: ${problem}`);
  return {
    bot: fields.bot as string,
    updateId: BigInt(fields.updateId as string).toString(),
    attempt: Number(fields.attempt),
    claimId: fields.claimId as string,
    destination: fields.destination,
  };
}

/**
 * The signed `webhook-id` is `bot:update_id` of this very update. Without
 * identity headers (a plain bot) the bot is unknown, but the form still tells an
 * update from the other messages signed with the same secret (`exhaustion:...`).
 */
function checkMessageId(messageId: string, identity: Identity | undefined, updateId: string): void {
  if (identity !== undefined) {
    if (messageId !== identityKey(identity)) {
      throw new Rejected("webhook-id does not match the identity headers");
    }
    return;
  }
  const colon = messageId.lastIndexOf(":");
  const bot = colon < 0 ? "" : messageId.slice(0, colon);
  const number = messageId.slice(colon + 1);
  if (!BOT_PATTERN.test(bot) || number !== updateId) {
    throw new Rejected("webhook-id is not bot:update_id of this update");
  }
}

/**
 * The identity headers and `X-Intake-Received-At` as the service signed them. A
 * service from before the fencing token sends neither: its identity passes
 * unsigned, as it always did, and its request has no fence token.
 */
function checkIdentitySignature(
  headers: Map<string, string>,
  identity: Identity,
  receivedAt: string | undefined,
  secret: string,
): void {
  const signatures = headers.get(IDENTITY_SIGNATURE_HEADER);
  if (signatures === undefined) {
    if (receivedAt !== undefined) {
      throw new Rejected("X-Intake-Received-At came without X-Intake-Identity-Signature");
    }
    return;
  }
  if (receivedAt === undefined) {
    throw new Rejected("X-Intake-Identity-Signature came without X-Intake-Received-At");
  }
  // webhook-timestamp was checked by verifySignature: digits, within the tolerance.
  const timestamp = BigInt(headers.get("webhook-timestamp") as string);
  const expected = sign(secret, identityMessage(identity, receivedAt), timestamp, "");
  if (!anySignatureMatches(signatures, expected)) {
    throw new Rejected("X-Intake-Identity-Signature does not match");
  }
}

/** Epoch milliseconds as canonical decimal text, or undefined when the header is absent. */
function millis(headers: Map<string, string>, name: string, label: string): string | undefined {
  const value = headers.get(name);
  if (value === undefined) return undefined;
  if (!isDigits(value) || BigInt(value) > MAX_BIGINT) {
    throw new Rejected(`${label} is not epoch milliseconds`);
  }
  return BigInt(value).toString();
}

/** A number as Python's `format(x, "g")` writes it (6 significant digits). */
export function formatG(value: number): string {
  if (Number.isNaN(value)) return "nan";
  if (!Number.isFinite(value)) return value > 0 ? "inf" : "-inf";
  if (value === 0) return Object.is(value, -0) ? "-0" : "0";
  const [mantissa, exponentText] = value.toExponential(5).split("e") as [string, string];
  const exponent = Number(exponentText);
  const strip = (text: string): string => (text.includes(".") ? text.replace(/\.?0+$/, "") : text);
  if (exponent < -4 || exponent >= 6) {
    const digits = String(Math.abs(exponent)).padStart(2, "0");
    return `${strip(mantissa)}e${exponent < 0 ? "-" : "+"}${digits}`;
  }
  return strip(value.toFixed(Math.max(0, 5 - exponent)));
}
