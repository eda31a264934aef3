/**
 * The body of a forwarded request as a Telegram update: UTF-8 JSON, an object,
 * whose `update_id` is written as an integer.
 *
 * `JSON.parse` alone cannot tell `12` from `12.0` or `1.2e1` (Python reads the
 * last two as floats and refuses them), nor keep an id past 2^53 exact; so the
 * `update_id` member's own text is read from the body too, and compared as a
 * decimal string.
 */

/** An update as the bot frameworks take it: the parsed body. */
export type Update = { update_id: number } & Record<string, unknown>;

export type UpdateReading =
  { ok: true; update: Update; updateId: string } | { ok: false; reason: string };

const INTEGER = /^-?(?:0|[1-9][0-9]*)$/;
const decoder = new TextDecoder("utf-8", { fatal: true }); // a leading BOM is dropped

export function readUpdate(body: Uint8Array): UpdateReading {
  let text: string;
  let update: unknown;
  try {
    text = decoder.decode(body);
    update = JSON.parse(text);
  } catch (error) {
    return { ok: false, reason: `the body is not JSON: ${(error as Error).message}` };
  }
  const raw =
    typeof update === "object" && update !== null && !Array.isArray(update)
      ? memberText(text, "update_id")
      : undefined;
  if (raw === undefined || !INTEGER.test(raw)) {
    return { ok: false, reason: "the body is not a Telegram update (no integer update_id)" };
  }
  return { ok: true, update: update as Update, updateId: BigInt(raw).toString() };
}

/**
 * The text of the last member named `name` of the object that `text` (valid
 * JSON, an object) holds; the last one, as both parsers keep the last of
 * duplicate names.
 */
function memberText(text: string, name: string): string | undefined {
  let found: string | undefined;
  let at = skipSpace(text, 0) + 1; // past "{"
  for (;;) {
    at = skipSpace(text, at);
    if (text[at] === "}") return found;
    const keyEnd = stringEnd(text, at);
    const key = JSON.parse(text.slice(at, keyEnd)) as string; // escapes decoded
    const valueStart = skipSpace(text, skipSpace(text, keyEnd) + 1); // past ":"
    const valueStop = valueEnd(text, valueStart);
    if (key === name) found = text.slice(valueStart, valueStop);
    at = skipSpace(text, valueStop);
    if (text[at] !== ",") return found;
    at += 1;
  }
}

function skipSpace(text: string, at: number): number {
  while (at < text.length && " \t\n\r".includes(text[at] as string)) at += 1;
  return at;
}

/** The index just past the string that starts (with its quote) at `at`. */
function stringEnd(text: string, at: number): number {
  let index = at + 1;
  while (text[index] !== '"') index += text[index] === "\\" ? 2 : 1;
  return index + 1;
}

/** The index just past the value that starts at `at`. */
function valueEnd(text: string, at: number): number {
  const first = text[at];
  if (first === '"') return stringEnd(text, at);
  if (first === "{" || first === "[") {
    let depth = 0;
    let index = at;
    do {
      const char = text[index];
      if (char === '"') {
        index = stringEnd(text, index);
        continue;
      }
      if (char === "{" || char === "[") depth += 1;
      else if (char === "}" || char === "]") depth -= 1;
      index += 1;
    } while (depth > 0);
    return index;
  }
  let index = at;
  while (index < text.length && !",}] \t\n\r".includes(text[index] as string)) index += 1;
  return index;
}
