/**
 * What a handler sees of its attempt (`ctx.intake`), and how it says that an
 * update can never succeed (`TerminalError`).
 */

import type { IntakeClient } from "./client";
import type { FenceToken, Forwarded } from "./forwarded";
import { identityKey, type Identity } from "./identity";

// A brand rather than `instanceof` alone: a bot may load another copy of the kit
// (a second node_modules), whose TerminalError is another class.
const TERMINAL = Symbol.for("telegram-intake-kit.TerminalError");

/**
 * Thrown by a handler: the update can never succeed (a retry would fail the same
 * way). The adapter answers 422 and the service records an exhaustion, instead
 * of retrying as it does after any other error.
 */
export class TerminalError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "TerminalError";
    Object.defineProperty(this, TERMINAL, { value: true });
  }
}

/** Whether `error` is a `TerminalError` (of this copy of the kit or another). */
export function isTerminal(error: unknown): error is TerminalError {
  return (
    error instanceof TerminalError ||
    (typeof error === "object" && error !== null && Reflect.get(error, TERMINAL) === true)
  );
}

/** The attempt a handler runs in: `ctx.intake`, undefined for a plain request. */
export class IntakeAttempt {
  readonly identity: Identity;
  /** Undefined from a service that sends no `X-Intake-Received-At`. */
  readonly fenceToken: FenceToken | undefined;
  /** When the lease ends (epoch ms), as the service said when it forwarded the update. */
  readonly leaseExpiresAt: number | undefined;
  /** When the service recorded the update (epoch ms). */
  readonly receivedAt: number | undefined;
  private readonly client: IntakeClient | undefined;

  constructor(forwarded: Forwarded & { identity: Identity }, client: IntakeClient | undefined) {
    this.identity = forwarded.identity;
    this.fenceToken = forwarded.fenceToken;
    this.leaseExpiresAt = forwarded.leaseExpiresAt;
    this.receivedAt = forwarded.receivedAt;
    this.client = client;
  }

  /**
   * The idempotency key of the update's effects for this destination:
   * `bot:update_id`, or `bot:destination:update_id` for a destination other
   * than `default`.
   */
  get key(): string {
    return identityKey(this.identity);
  }

  /**
   * The destination this attempt delivers to: `default` for the bot's own
   * downstream, or the name of another; every callback sends it back.
   */
  get destination(): string {
    return this.identity.destination;
  }

  /**
   * Whether this attempt still holds its lease. A hint, not a guarantee: a
   * reclaim can pass between the answer and a write (check-then-act).
   */
  async owns(): Promise<boolean> {
    if (this.client === undefined) {
      throw new Error("ctx.intake.owns() needs intakeUrl and apiKey in intakeHandler's options");
    }
    return (await this.client.owns(this.identity)).owned;
  }
}

/** For a bot's context type: `Bot<Context & IntakeFlavor>`, `Telegraf<Context & IntakeFlavor>`. */
export interface IntakeFlavor {
  /** The attempt being handled; undefined for a plain request (no identity headers). */
  readonly intake?: IntakeAttempt;
}
