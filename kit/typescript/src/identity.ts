/**
 * One attempt's identity, with the callback API's rules for each field (the
 * Python kit's `wire.Identity`), and the messages its validation gives.
 *
 * `updateId` is a decimal string: the service stores update ids as 64-bit
 * integers, and a JavaScript number holds every whole number only up to 2^53.
 * `attempt` (at most 2^31 - 1) is an ordinary number.
 */

export const BOT_PATTERN = /^[a-z0-9][a-z0-9_-]{0,31}$/;
export const MAX_BIGINT = 2n ** 63n - 1n;
export const MAX_INTEGER = 2 ** 31 - 1;
export const MAX_ERROR_LENGTH = 2000;
/**
 * The destination of a bot's own downstream: what an identity without one
 * means, so that a kit or a service from before destinations keeps working.
 */
export const DEFAULT_DESTINATION = "default";

/**
 * One attempt: what `X-Intake-Bot`, `-Update-Id`, `-Attempt`, `-Claim-Id` and
 * `-Destination` carried.
 */
export interface Identity {
  readonly bot: string;
  /** Decimal digits, 0 .. 2^63 - 1, without leading zeros. */
  readonly updateId: string;
  readonly attempt: number;
  /** Opaque; compared exactly. */
  readonly claimId: string;
  /** The destination the attempt delivers to (`default`: the bot's own downstream). */
  readonly destination: string;
}

/**
 * An identity as a caller may hold it: `updateId` also as a number or a
 * bigint, `destination` left out for `default`.
 */
export interface IdentityInput {
  readonly bot: string;
  readonly updateId: string | number | bigint;
  readonly attempt: number;
  readonly claimId: string;
  readonly destination?: string;
}

/**
 * The idempotency key of the update's effects for its destination:
 * `bot:update_id` for `default`, `bot:destination:update_id` for any other
 * (the signed `webhook-id`).
 */
export function identityKey(
  identity: Pick<Identity, "bot" | "updateId"> & { readonly destination?: string },
): string {
  const destination = identity.destination ?? DEFAULT_DESTINATION;
  if (destination === DEFAULT_DESTINATION) return `${identity.bot}:${identity.updateId}`;
  return `${identity.bot}:${destination}:${identity.updateId}`;
}

/**
 * What `X-Intake-Identity-Signature` signs, as a Standard Webhooks message id
 * (with an empty payload). The claim id, the one field that may hold a colon,
 * comes last. `receivedAt` is the decimal text of the epoch milliseconds. A
 * destination other than `default` is signed under its own prefix, so that no
 * message of one form reads as the other.
 */
export function identityMessage(identity: Identity, receivedAt: string): string {
  const tail = `${identity.updateId}:${identity.attempt}:${receivedAt}:${identity.claimId}`;
  if (identity.destination === DEFAULT_DESTINATION) return `identity:${identity.bot}:${tail}`;
  return `delivery:${identity.bot}:${identity.destination}:${tail}`;
}

/** ASCII digits only: a Latin-1 "¹²³" from a header's decoding is no digit here. */
export function isDigits(value: string): boolean {
  return /^[0-9]+$/.test(value);
}

/** The length Python (and pydantic) count: code points, not UTF-16 units. */
export function codePoints(value: string): number {
  let count = 0;
  for (const _ of value) count += 1;
  return count;
}

/**
 * The first rule that `fields` break, worded as pydantic words it for the
 * Python kit's `Identity`, or undefined. Fields are checked in the model's
 * order: bot, update_id, attempt, claim_id. Integers arrive as a decimal string
 * (a header's digits), a number, a bigint, or anything else (not an integer).
 */
export function identityProblem(fields: {
  bot: unknown;
  updateId: unknown;
  attempt: unknown;
  claimId: unknown;
  destination?: unknown;
}): string | undefined {
  const { bot, updateId, attempt, claimId, destination } = fields;
  const name = nameProblem(bot);
  if (name !== undefined) return name;
  const update = integerProblem(updateId, 0n, MAX_BIGINT);
  if (update !== undefined) return update;
  const number = integerProblem(attempt, 1n, BigInt(MAX_INTEGER));
  if (number !== undefined) return number;
  const claim = textProblem(claimId, 64);
  if (claim !== undefined) return claim;
  return destination === undefined ? undefined : nameProblem(destination);
}

/** The rule a bot's or a destination's name breaks, or undefined. */
function nameProblem(value: unknown): string | undefined {
  if (typeof value !== "string") return "Input should be a valid string";
  if (!BOT_PATTERN.test(value)) return `String should match pattern '${BOT_PATTERN.source}'`;
  return undefined;
}

/** An identity from validated fields, or a TypeError with pydantic's wording. */
export function toIdentity(input: IdentityInput): Identity {
  const problem = identityProblem(input);
  if (problem !== undefined) throw new TypeError(`identity invalid: ${problem}`);
  return {
    bot: input.bot,
    updateId: BigInt(input.updateId).toString(),
    attempt: Number(input.attempt),
    claimId: input.claimId,
    destination: input.destination ?? DEFAULT_DESTINATION,
  };
}

/** The rule a whole number in [low, high] breaks, or undefined. */
export function integerProblem(value: unknown, low: bigint, high: bigint): string | undefined {
  let whole: bigint;
  if (typeof value === "bigint") whole = value;
  else if (typeof value === "number" && Number.isSafeInteger(value)) whole = BigInt(value);
  else if (typeof value === "string" && isDigits(value)) whole = BigInt(value);
  else return "Input should be a valid integer";
  if (whole < low) return `Input should be greater than or equal to ${low}`;
  if (whole > high) return `Input should be less than or equal to ${high}`;
  return undefined;
}

/** The rule a text of 1..`max` code points without NUL breaks, or undefined. */
export function textProblem(value: unknown, max: number): string | undefined {
  if (typeof value !== "string") return "Input should be a valid string";
  const length = codePoints(value);
  if (length < 1) return "String should have at least 1 character";
  if (length > max) return `String should have at most ${max} characters`;
  if (value.includes("\0")) return "String should match pattern '^[^\\x00]*$'";
  return undefined;
}
