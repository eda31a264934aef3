/**
 * telegram-intake-kit: what a grammY or Telegraf bot needs behind telegram-intake.
 *
 * - `intakeHandler(bot, options)`: the bot's request handler in place of the
 *   framework's webhook callback; handlers read their attempt as `ctx.intake`;
 * - `readForwarded(headers, body, options)`: verify and read one forwarded request;
 * - `IntakeClient`: the callback API (owns, renew, settle, acknowledge);
 * - `sign`: the Standard Webhooks signature the service sends.
 */

export { IntakeAttempt, TerminalError, isTerminal, type IntakeFlavor } from "./attempt";
export {
  CallbackError,
  IntakeClient,
  type Acknowledged,
  type ClientOptions,
  type Outcome,
  type Owned,
  type Renewed,
  type Settled,
} from "./client";
export {
  DEFAULT_TOLERANCE_SECONDS,
  Rejected,
  readForwarded,
  type FenceToken,
  type Forwarded,
  type HeadersLike,
  type ReadOptions,
} from "./forwarded";
export { currentAttempt, type UpdateHandler } from "./frameworks";
export { intakeHandler, type IntakeHandlerOptions, type IntakeRequestHandler } from "./handler";
export {
  DEFAULT_DESTINATION,
  identityKey,
  identityMessage,
  toIdentity,
  type Identity,
  type IdentityInput,
} from "./identity";
export { sign, signingKey } from "./signature";
export type { Update } from "./update";
