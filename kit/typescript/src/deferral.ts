/**
 * The deferred path: once the adapter has answered 202, the service waits for the
 * bot to settle the attempt through the callback API. Until the handlers end, the
 * lease is renewed (at once, then every third of the lease); then the attempt is
 * settled with how they ended. A renew that answers `renewed: false` means the
 * attempt was lost (reclaimed): it is neither renewed nor settled any more.
 */

import { CallbackError, type IntakeClient, type Outcome } from "./client";
import { codePoints, MAX_ERROR_LENGTH, type Identity } from "./identity";
import { describe, type Ending } from "./frameworks";

export interface DeferralOptions {
  client: IntakeClient;
  identity: Identity;
  leaseMs: number;
  log: (line: string) => void;
  /** Pauses between settle tries (network errors, 5xx). */
  settleBackoffMs?: readonly number[];
}

const SETTLE_BACKOFF_MS = [250, 1000, 3000];

/** Keep `identity`'s lease while `running` lasts, then settle it; never rejects. */
export async function carryDeferred(
  running: Promise<Ending>,
  options: DeferralOptions,
): Promise<void> {
  const { client, identity, leaseMs, log } = options;
  const name = `${identity.bot}:${identity.updateId} attempt ${identity.attempt}`;
  let finished = false;
  let wake: () => void = () => undefined;
  void running.then(() => {
    finished = true;
    wake();
  });
  let lost = false;
  while (!finished && !lost) {
    try {
      const answer = await client.renew(identity, leaseMs);
      if (!answer.renewed) {
        lost = true;
        log(`${name} lost its lease (renew answered renewed: false): it will not be settled`);
      }
    } catch (error) {
      log(`${name}: renew failed, trying again later: ${describe(error)}`);
    }
    if (finished || lost) break;
    await new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, leaseMs / 3);
      wake = () => {
        clearTimeout(timer);
        resolve();
      };
    });
  }
  const ending = await running;
  if (lost) return;
  await settle(ending, options, name);
}

async function settle(ending: Ending, options: DeferralOptions, name: string): Promise<void> {
  const { client, identity, log } = options;
  const [outcome, error] = settlement(ending);
  const pauses = options.settleBackoffMs ?? SETTLE_BACKOFF_MS;
  for (let tried = 0; ; tried += 1) {
    try {
      const answer = await client.settle(identity, outcome, error === undefined ? {} : { error });
      if (!answer.settled)
        log(`${name} was not settled ${outcome}: the service answered settled: false`);
      return;
    } catch (failure) {
      const transient = !(failure instanceof CallbackError) || failure.status >= 500;
      if (!transient || tried >= pauses.length) {
        // The service reclaims the update when the lease ends, and tries it again.
        log(`${name} could not be settled ${outcome}, giving up: ${describe(failure)}`);
        return;
      }
      await new Promise((resolve) => setTimeout(resolve, pauses[tried]));
    }
  }
}

/** The settle call for how the handlers ended. */
function settlement(ending: Ending): [Outcome, string | undefined] {
  switch (ending.kind) {
    case "completed":
      return ["completed", undefined];
    case "terminal":
      return ["exhausted", errorText(ending.message, "TerminalError")];
    case "failed":
      return ["failed", errorText(ending.text, "Error")];
  }
}

/** What the callback API takes as `error`: 1..2000 code points, no NUL. */
export function errorText(text: string, fallback: string): string {
  const clean = text.replace(/\0/g, "\ufffd");
  if (clean === "") return fallback;
  if (codePoints(clean) <= MAX_ERROR_LENGTH) return clean;
  return Array.from(clean).slice(0, MAX_ERROR_LENGTH).join("");
}
