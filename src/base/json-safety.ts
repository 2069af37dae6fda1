/**
 * The shape limits of JSON values, in one place, and the checks that apply them.
 *
 * What PostgreSQL's jsonb cannot keep: the NUL character (`\u0000`) and lone UTF-16 surrogates in
 * any string or key, and numbers JSON cannot represent (`1e400` parses to Infinity, which
 * `JSON.stringify` would silently turn into `null`). What corral does not take: a value nested
 * deeper than MAX_JSON_DEPTH. Found here, such a value is refused with a clear reason instead of
 * failing deep inside a transaction (or being changed without a word).
 *
 * Why a depth limit: `JSON.stringify` recurses and throws a RangeError somewhere past 4,000 levels
 * (less on a deeper stack), PostgreSQL's jsonb parser stops at its stack depth (past 10,000 levels
 * with the default `max_stack_depth` of 2 MB), and parsers of other languages stop earlier
 * (serde_json at 128 levels of the whole message). 100 levels is far more than any conversation
 * needs, and a stored value still fits within 128 levels in every message that carries it (at
 * most 4 levels of envelope: `context.messages[].content`). Every other dimension of a value is
 * bounded by bytes already: a frame by `max_message_bytes`, an event by `CORRAL_MAX_EVENT_BYTES`,
 * far below what jsonb can hold (256 MB per value, 2^28 entries per container).
 *
 * Every check here is iterative: no depth, however hostile, can exhaust the stack.
 */
import { CorralError } from './errors.ts';

/** The most levels of nested arrays and objects in a JSON value corral stores or takes from a worker (`[[1]]` has 2). */
export const MAX_JSON_DEPTH = 100;

/**
 * What `pruneDeepJson` puts where it cut a subtree. It holds a NUL, which no stored value can
 * hold, so a value that carries it is always refused (`unstorableReason` names it as too deep).
 */
export const TOO_DEEP = '\u0000corral: nested too deep';
const TOO_DEEP_JSON = JSON.stringify(TOO_DEEP);

/**
 * Why `value` cannot be stored as jsonb (nested deeper than `maxDepth`, or holding what jsonb
 * cannot keep), with the path of the first offender from `path`; null when it can.
 */
export function unstorableReason(value: unknown, path = '$', maxDepth = MAX_JSON_DEPTH): string | null {
  // the common case, a storable value, pays no path strings: the walk that names the offender
  // runs only when there is one
  if (firstProblem(value, maxDepth, null) === null) return null;
  const where = { path };
  const why = firstProblem(value, maxDepth, where) ?? 'cannot be stored';
  return `${shortPath(where.path)}: ${why}`;
}

/**
 * Depth-first, in document order. With `where`, it tracks each value's path and leaves the
 * offender's in `where.path`.
 */
function firstProblem(value: unknown, maxDepth: number, where: { path: string } | null): string | null {
  const values: unknown[] = [value];
  const depths: number[] = [0];
  const paths: string[] | null = where ? [where.path] : null;
  while (values.length > 0) {
    const v = values.pop();
    const depth = depths.pop()!;
    const path = paths?.pop() ?? '';
    let why: string | null = null;
    if (typeof v === 'string') why = v === TOO_DEEP ? tooDeep(maxDepth) : badString(v);
    else if (typeof v === 'number') {
      if (!Number.isFinite(v)) why = `number out of range for JSON (${String(v)})`;
    } else if (v !== null && typeof v === 'object') {
      if (depth >= maxDepth) why = tooDeep(maxDepth);
      else if (Array.isArray(v)) {
        for (let i = v.length - 1; i >= 0; i--) {
          values.push(v[i]);
          depths.push(depth + 1);
          paths?.push(`${path}[${i}]`);
        }
      } else {
        const keys = Object.keys(v);
        for (let i = keys.length - 1; i >= 0; i--) {
          const k = keys[i]!;
          const bad = badString(k);
          if (bad) {
            why = `key ${bad}`;
            break;
          }
          values.push((v as Record<string, unknown>)[k]);
          depths.push(depth + 1);
          paths?.push(`${path}.${k.slice(0, 40)}`);
        }
      }
    }
    if (why !== null) {
      if (where) where.path = path;
      return why;
    }
  }
  return null;
}

const tooDeep = (maxDepth: number) => `nested deeper than ${maxDepth} levels of arrays and objects (the limit)`;

/** A path of a deeply nested value, shortened in the middle. */
function shortPath(path: string): string {
  return path.length <= 80 ? path : `${path.slice(0, 48)}…${path.slice(-24)}`;
}

const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

function badString(s: string): string | null {
  if (s.includes('\u0000')) return 'contains \\u0000 (NUL), which PostgreSQL cannot store';
  if (LONE_SURROGATE.test(s)) return 'contains a lone UTF-16 surrogate, which PostgreSQL cannot store';
  return null;
}

const LONE_SURROGATES = new RegExp(LONE_SURROGATE.source, 'g');

/** `s` with NULs and lone surrogates replaced by U+FFFD: for diagnostic text that must be kept. */
export function storableText(s: string): string {
  return s.replace(/\u0000/g, '\uFFFD').replace(LONE_SURROGATES, '\uFFFD');
}

/**
 * JSON text with every array or object that opens deeper than `maxDepth` levels replaced by the
 * string TOO_DEEP; the same string when there is none. One pass over the text, allocating
 * nothing for a text within the limit, so a frame of a million brackets costs a scan instead of a
 * parse that builds half a million nested arrays. The text is not validated here (JSON.parse
 * does that after): an unterminated subtree is cut to the end, which leaves invalid JSON.
 */
export function pruneDeepJson(text: string, maxDepth: number): string {
  let out: string[] | null = null;
  let copied = 0;
  let depth = 0;
  const n = text.length;
  for (let i = 0; i < n; i++) {
    const c = text.charCodeAt(i);
    if (c === 0x22 /* " */) {
      i = stringEnd(text, i);
      continue;
    }
    if (c === 0x5b /* [ */ || c === 0x7b /* { */) {
      if (++depth <= maxDepth) continue;
      const end = subtreeEnd(text, i);
      out ??= [];
      out.push(text.slice(copied, i), TOO_DEEP_JSON);
      copied = end;
      i = end - 1;
      depth--;
    } else if (c === 0x5d /* ] */ || c === 0x7d /* } */) depth--;
  }
  if (out === null) return text;
  out.push(text.slice(copied));
  return out.join('');
}

/** The index of the quote that closes the string opened at `open` (or the last index). */
function stringEnd(text: string, open: number): number {
  let j = open;
  for (;;) {
    j = text.indexOf('"', j + 1);
    if (j < 0) return text.length - 1;
    let backslashes = 0;
    for (let k = j - 1; text.charCodeAt(k) === 0x5c /* \ */; k--) backslashes++;
    if (backslashes % 2 === 0) return j;
  }
}

/** The index just past the array or object opened at `open` (or the text's length). */
function subtreeEnd(text: string, open: number): number {
  let depth = 0;
  for (let i = open; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === 0x22) i = stringEnd(text, i);
    else if (c === 0x5b || c === 0x7b) depth++;
    else if ((c === 0x5d || c === 0x7d) && --depth === 0) return i + 1;
  }
  return text.length;
}

/**
 * The payload as it will be stored, checked before anything is written: JSON-serialisable,
 * within the shape limits of src/base/json-safety.ts (nested at most MAX_JSON_DEPTH deep, no NUL, no
 * lone surrogate, no number JSON cannot keep), and at most `maxBytes` of JSON. An event too large for the wire would otherwise hold a worker slot until
 * its lease ran out, on every retry.
 */
export function toJsonPayload(event: unknown, maxBytes: number): unknown {
  if (event === undefined) throw new CorralError('invalid_argument', 'an event payload is required');
  const unstorable = unstorableReason(event);
  if (unstorable) throw new CorralError('invalid_argument', `the event payload cannot be stored: ${unstorable}`);
  let text: string;
  try {
    text = JSON.stringify(event);
  } catch (e) {
    throw new CorralError('invalid_argument', 'the event payload must be JSON-serialisable', { cause: e });
  }
  const bytes = Buffer.byteLength(text, 'utf8');
  if (bytes > maxBytes) {
    throw new CorralError('payload_too_large', `the event payload is ${bytes} bytes; the limit is ${maxBytes} (CORRAL_MAX_EVENT_BYTES)`, {
      details: { bytes, maxBytes },
    });
  }
  const payload = JSON.parse(text) as unknown;
  // what is stored, checked again: a `toJSON` may have made something the value did not hold
  const stored = unstorableReason(payload);
  if (stored) throw new CorralError('invalid_argument', `the event payload cannot be stored: ${stored}`);
  return payload;
}
