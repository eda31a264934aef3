/**
 * A client for the callback API: owns, renew, settle, acknowledge.
 *
 * The requests are the Python kit's (`wire.py`): snake_case JSON, checked
 * here before they are sent, so a request the service would refuse with 422
 * fails at once with the rule it breaks. A connection failure is retried twice
 * (as the Python client's transport does); an HTTP answer never is: one that is
 * not 2xx throws `CallbackError` with the service's `error`.
 */

import {
  MAX_ERROR_LENGTH,
  integerProblem,
  textProblem,
  toIdentity,
  DEFAULT_DESTINATION,
  type Identity,
  type IdentityInput,
} from "./identity";

/** The service refused or failed a call (401, 403, 404, 409, 422, 503, ...). */
export class CallbackError extends Error {
  readonly status: number;
  /** The service's own words (its answer's `error`). */
  readonly detail: string;

  constructor(status: number, message: string) {
    super(`${status}: ${message}`);
    this.name = "CallbackError";
    this.status = status;
    this.detail = message;
  }
}

export type Outcome = "completed" | "failed" | "exhausted";

export interface Owned {
  readonly owned: boolean;
  /** When the answer stops holding (epoch ms, by the database clock); null if not owned. */
  readonly leaseExpiresAt: number | null;
}

export interface Renewed {
  readonly renewed: boolean;
  readonly leaseExpiresAt: number | null;
}

export interface Settled {
  readonly settled: boolean;
}

export interface Acknowledged {
  readonly acknowledged: boolean;
}

export interface ClientOptions {
  /** Per call, until the answer has arrived. */
  timeoutMs?: number;
  /** Another fetch (a test's, a proxy's); default the global one of Node 20. */
  fetch?: typeof fetch;
}

const RETRIES = 2;
const BACKOFF_MS = 100;
const MAX_LEASE_MS = 86_400_000;
const MAX_RETRY_AFTER_MS = 7 * 86_400_000;

/** Calls `/v1/claims/*` and `/v1/exhaustions/acknowledge` of one telegram-intake. */
export class IntakeClient {
  private readonly baseUrl: string;
  private readonly apiKey: string;
  private readonly timeoutMs: number;
  private readonly fetch: typeof fetch;

  constructor(baseUrl: string, apiKey: string, options: ClientOptions = {}) {
    this.baseUrl = baseUrl.replace(/\/+$/, "");
    this.apiKey = apiKey;
    this.timeoutMs = options.timeoutMs ?? 10_000;
    this.fetch = options.fetch ?? globalThis.fetch;
  }

  /** Whether `identity` still holds its lease, and until when. */
  async owns(identity: IdentityInput): Promise<Owned> {
    const answer = await this.call("/v1/claims/owns", fieldsOf(toIdentity(identity)));
    return { owned: flag(answer, "owned"), leaseExpiresAt: millisOrNull(answer) };
  }

  /** Extend a live lease to `leaseMs` from now (default: the bot's lease). */
  async renew(identity: IdentityInput, leaseMs?: number): Promise<Renewed> {
    const fields = fieldsOf(toIdentity(identity));
    if (leaseMs !== undefined) {
      check("lease_ms", integerProblem(leaseMs, 1n, BigInt(MAX_LEASE_MS)));
      fields.push(["lease_ms", String(leaseMs)]);
    }
    const answer = await this.call("/v1/claims/renew", fields);
    return { renewed: flag(answer, "renewed"), leaseExpiresAt: millisOrNull(answer) };
  }

  /** End the attempt: completed, failed (retried, after `retryAfterMs` if given) or exhausted. */
  async settle(
    identity: IdentityInput,
    outcome: Outcome,
    options: { error?: string; retryAfterMs?: number } = {},
  ): Promise<Settled> {
    const fields = fieldsOf(toIdentity(identity));
    const { error, retryAfterMs } = options;
    if (!["completed", "failed", "exhausted"].includes(outcome)) {
      throw new TypeError(
        `settle invalid: outcome is completed, failed or exhausted, not ${outcome}`,
      );
    }
    if (error !== undefined) check("error", textProblem(error, MAX_ERROR_LENGTH));
    if (retryAfterMs !== undefined) {
      check("retry_after_ms", integerProblem(retryAfterMs, 0n, BigInt(MAX_RETRY_AFTER_MS)));
    }
    // The model's own rules, after its fields' (as pydantic checks them).
    if (retryAfterMs !== undefined && outcome !== "failed") {
      throw new TypeError("settle invalid: retry_after_ms is for outcome 'failed' only");
    }
    if (error !== undefined && outcome === "completed") {
      throw new TypeError("settle invalid: error is for outcomes 'failed' and 'exhausted' only");
    }
    fields.push(["outcome", JSON.stringify(outcome)]);
    if (error !== undefined) fields.push(["error", JSON.stringify(error)]);
    if (retryAfterMs !== undefined) fields.push(["retry_after_ms", String(retryAfterMs)]);
    const answer = await this.call("/v1/claims/settle", fields);
    return { settled: flag(answer, "settled") };
  }

  /** Acknowledge the exhaustion with exactly this identity. */
  async acknowledge(identity: IdentityInput): Promise<Acknowledged> {
    const answer = await this.call("/v1/exhaustions/acknowledge", fieldsOf(toIdentity(identity)));
    return { acknowledged: flag(answer, "acknowledged") };
  }

  private async call(path: string, fields: [string, string][]): Promise<Record<string, unknown>> {
    const body = `{${fields.map(([name, json]) => `${JSON.stringify(name)}:${json}`).join(",")}}`;
    const response = await this.post(path, body);
    const text = await response.text();
    if (response.status < 200 || response.status > 299) {
      throw new CallbackError(response.status, problemOf(text));
    }
    const answer: unknown = JSON.parse(text);
    if (typeof answer !== "object" || answer === null || Array.isArray(answer)) {
      throw new TypeError(`${path} answered something that is not an object: ${text}`);
    }
    return answer as Record<string, unknown>;
  }

  /** One POST; a network failure (fetch's TypeError) is tried again, a timeout is not. */
  private async post(path: string, body: string): Promise<Response> {
    for (let attempt = 0; ; attempt += 1) {
      try {
        return await this.fetch(`${this.baseUrl}${path}`, {
          method: "POST",
          headers: {
            authorization: `Bearer ${this.apiKey}`,
            "content-type": "application/json",
          },
          body,
          signal: AbortSignal.timeout(this.timeoutMs),
        });
      } catch (error) {
        if (!(error instanceof TypeError) || attempt >= RETRIES) throw error;
        await new Promise((resolve) => setTimeout(resolve, BACKOFF_MS * 2 ** attempt));
      }
    }
  }
}

/**
 * The identity's members, in the order the Python kit's models write them;
 * `destination` only when it is not `default`, so that a service from before
 * destinations (which refuses members it does not know) takes the request.
 */
function fieldsOf(identity: Identity): [string, string][] {
  const fields: [string, string][] = [
    ["bot", JSON.stringify(identity.bot)],
    ["update_id", identity.updateId], // decimal digits: exact past 2^53
    ["attempt", String(identity.attempt)],
    ["claim_id", JSON.stringify(identity.claimId)],
  ];
  if (identity.destination !== DEFAULT_DESTINATION) {
    fields.push(["destination", JSON.stringify(identity.destination)]);
  }
  return fields;
}

function check(field: string, problem: string | undefined): void {
  if (problem !== undefined) throw new TypeError(`${field} invalid: ${problem}`);
}

function problemOf(text: string): string {
  try {
    const parsed: unknown = JSON.parse(text);
    if (typeof parsed === "object" && parsed !== null && "error" in parsed) {
      const error = (parsed as { error: unknown }).error;
      return typeof error === "string" ? error : JSON.stringify(error);
    }
  } catch {
    // not JSON: the text itself
  }
  return text;
}

function flag(answer: Record<string, unknown>, name: string): boolean {
  const value = answer[name];
  if (typeof value !== "boolean") throw new TypeError(`the answer has no boolean ${name}`);
  return value;
}

function millisOrNull(answer: Record<string, unknown>): number | null {
  const value = answer["lease_expires_at"];
  if (value === null || value === undefined) return null;
  if (typeof value !== "number" || !Number.isInteger(value)) {
    throw new TypeError("the answer's lease_expires_at is not epoch milliseconds");
  }
  return value;
}
