/**
 * Running one update through a bot to its end, and telling how it ended:
 * completed, terminal (a `TerminalError`), or failed. grammY and Telegraf are
 * told apart by shape, so the kit needs neither at run time; any object with a
 * `handleUpdate` works as the generic case.
 *
 * - grammY: `handleUpdate` wraps every error in a `BotError` (`.error` holds the
 *   handler's), even when the bot called `bot.catch`, which only polling uses. So
 *   the adapter does what polling does: a non-terminal `BotError` goes to
 *   `bot.errorHandler`; resolving means handled. The default handler logs "No
 *   error handler was set!" and rethrows: failed.
 * - Telegraf: `handleUpdate` gives an error to `bot.handleError` (by default it
 *   sets `process.exitCode = 1` and rethrows; `bot.catch` replaces it). A
 *   catch-all handler would swallow a `TerminalError`, so the kit wraps
 *   `handleError` to record one first, and to put `process.exitCode` back.
 */

import { AsyncLocalStorage } from "node:async_hooks";
import { isTerminal, type IntakeAttempt } from "./attempt";

/** Anything with grammY's or Telegraf's `handleUpdate(update)`. */
export interface UpdateHandler {
  handleUpdate(update: any, ...rest: any[]): unknown;
}

export type Ending =
  { kind: "completed" } | { kind: "terminal"; message: string } | { kind: "failed"; text: string };

type Kind = "grammy" | "telegraf" | "generic";

// ctx.update is the very object given to handleUpdate (both frameworks), so it keys
// what the adapter knows of the update while its handlers run.
const attempts = new WeakMap<object, IntakeAttempt>();
const terminals = new WeakMap<object, unknown>();
const storage = new AsyncLocalStorage<IntakeAttempt | undefined>();
const GETTER = Symbol.for("telegram-intake-kit.intake-getter");
const WRAPPED = Symbol.for("telegram-intake-kit.handleError");

/**
 * The attempt being handled, for code that has no `ctx` (or a bot whose context
 * class the kit could not find); undefined outside a handler or for a plain request.
 */
export function currentAttempt(): IntakeAttempt | undefined {
  return storage.getStore();
}

export class Runner {
  private readonly bot: UpdateHandler & Record<string | symbol, unknown>;
  readonly kind: Kind;
  /** Whether handlers can read `ctx.intake` (else only `currentAttempt()`). */
  readonly contextGetter: boolean;
  private initializing: Promise<void> | undefined;

  constructor(bot: UpdateHandler) {
    if (typeof bot?.handleUpdate !== "function") {
      throw new TypeError("intakeHandler needs a bot with handleUpdate (grammY's Bot, Telegraf)");
    }
    this.bot = bot as UpdateHandler & Record<string | symbol, unknown>;
    this.kind = kindOf(this.bot);
    this.contextGetter = defineGetter(contextPrototype(this.bot, this.kind));
    if (this.kind === "telegraf") wrapHandleError(this.bot);
  }

  /** The Telegraf bot's `handlerTimeout`, if it has one that is finite. */
  get finiteHandlerTimeout(): number | undefined {
    const options = this.bot["options"] as { handlerTimeout?: unknown } | undefined;
    const timeout = options?.handlerTimeout;
    return typeof timeout === "number" && Number.isFinite(timeout) ? timeout : undefined;
  }

  /** Run `update` through the bot; never rejects. */
  async run(update: object, attempt: IntakeAttempt | undefined): Promise<Ending> {
    if (attempt !== undefined) attempts.set(update, attempt);
    try {
      await this.ready();
      await storage.run(attempt, () => this.bot.handleUpdate(update));
      const recorded = terminals.get(update);
      return recorded === undefined ? { kind: "completed" } : terminal(recorded);
    } catch (error) {
      return await this.failure(update, error);
    } finally {
      terminals.delete(update);
    }
  }

  private async failure(update: object, error: unknown): Promise<Ending> {
    const inner = unwrap(error);
    if (isTerminal(inner)) return terminal(inner);
    const recorded = terminals.get(update); // Telegraf: seen before the bot's handler rethrew
    if (recorded !== undefined) return terminal(recorded);
    if (this.kind === "grammy" && isBotError(error)) {
      const handle = this.bot["errorHandler"];
      if (typeof handle === "function") {
        try {
          await handle.call(this.bot, error);
          return { kind: "completed" }; // the bot's own error handler took it
        } catch (again) {
          return { kind: "failed", text: describe(unwrap(again)) };
        }
      }
    }
    if (this.kind === "telegraf" && this.bot["botInfo"] === undefined) {
      // Telegraf keeps a failed getMe promise forever: forget it, so the next update asks again.
      this.bot["botInfoCall"] = undefined;
    }
    return { kind: "failed", text: describe(inner) };
  }

  /** grammY needs `bot.init()` (getMe) before its first update: once, shared by concurrent requests. */
  private async ready(): Promise<void> {
    if (this.kind !== "grammy" || (this.bot["isInited"] as () => boolean).call(this.bot)) return;
    this.initializing ??= (async () => {
      try {
        await (this.bot["init"] as () => Promise<void>).call(this.bot);
      } finally {
        this.initializing = undefined;
      }
    })();
    await this.initializing;
  }
}

function kindOf(bot: Record<string | symbol, unknown>): Kind {
  if (
    typeof bot["init"] === "function" &&
    typeof bot["isInited"] === "function" &&
    "errorHandler" in bot
  ) {
    return "grammy";
  }
  if (typeof bot["handleError"] === "function" && "telegram" in bot) return "telegraf";
  return "generic";
}

/** grammY: `bot.ContextConstructor` (private in its typings); Telegraf: `bot.options.contextType`. */
function contextPrototype(bot: Record<string | symbol, unknown>, kind: Kind): object | undefined {
  const type =
    kind === "grammy"
      ? bot["ContextConstructor"]
      : kind === "telegraf"
        ? (bot["options"] as { contextType?: unknown } | undefined)?.contextType
        : undefined;
  return typeof type === "function" ? (type.prototype as object) : undefined;
}

/** Define `intake` on the context class once; false if it is missing or already someone else's. */
function defineGetter(prototype: object | undefined): boolean {
  if (prototype === undefined) return false;
  if (Reflect.get(prototype, GETTER) === true) return true;
  if (Object.prototype.hasOwnProperty.call(prototype, "intake")) return false;
  Object.defineProperty(prototype, "intake", {
    configurable: true,
    get(this: { update?: unknown }) {
      const update = this.update;
      return typeof update === "object" && update !== null ? attempts.get(update) : undefined;
    },
    // A bot that assigns ctx.intake itself keeps its own value on that context.
    set(this: object, value: unknown) {
      Object.defineProperty(this, "intake", {
        value,
        writable: true,
        configurable: true,
        enumerable: true,
      });
    },
  });
  Object.defineProperty(prototype, GETTER, { value: true });
  return true;
}

/**
 * Make Telegraf's `handleError` (a plain field; `bot.catch` assigns it) an
 * accessor whose function records a `TerminalError` for the update before the
 * bot's handler sees it, and undoes the default handler's `process.exitCode = 1`:
 * the adapter answered the error; the process did not fail.
 */
function wrapHandleError(bot: Record<string | symbol, unknown>): void {
  if (bot[WRAPPED] === true) return;
  let current = bot["handleError"] as (error: unknown, ctx: unknown) => unknown;
  const wrapper = async (
    error: unknown,
    ctx: { update?: unknown } | undefined,
  ): Promise<unknown> => {
    const update = ctx?.update;
    if (isTerminal(error) && typeof update === "object" && update !== null)
      terminals.set(update, error);
    const exitCode = process.exitCode;
    try {
      return await current.call(bot, error, ctx);
    } finally {
      process.exitCode = exitCode;
    }
  };
  Object.defineProperty(bot, "handleError", {
    configurable: true,
    enumerable: true,
    get: () => wrapper,
    set: (handler: (error: unknown, ctx: unknown) => unknown) => {
      current = handler;
    },
  });
  Object.defineProperty(bot, WRAPPED, { value: true });
}

/** grammY's BotError, by shape: a second copy of grammY has another class. */
function isBotError(error: unknown): error is Error & { error: unknown } {
  return error instanceof Error && error.name === "BotError" && "error" in error;
}

function unwrap(error: unknown): unknown {
  return isBotError(error) ? error.error : error;
}

function terminal(error: unknown): Ending {
  return { kind: "terminal", message: error instanceof Error ? error.message : String(error) };
}

/** `Name: message`, what a 500 answer and a failed settle carry. */
export function describe(error: unknown): string {
  return error instanceof Error ? `${error.name}: ${error.message}` : String(error);
}
