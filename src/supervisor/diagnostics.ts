/**
 * Diagnostic text for `failed` events and recorded failures. Bounded because events sit in a
 * buffer and travel to logs and the HTTP status page: a child throwing a megabyte-long message
 * (e.g. a whole model response) must not blow up either.
 */
import { CorralError } from '../base/errors.ts';

/** Upper bound of a diagnostic, in UTF-8 bytes. */
export const MAX_DIAGNOSTIC_BYTES = 1024;

/** UTF-8 length of the code point starting at `text[i]`, and how many UTF-16 units it spans. */
function codePointAt(text: string, i: number): { bytes: number; units: number } {
  const cp = text.codePointAt(i)!;
  if (cp < 0x80) return { bytes: 1, units: 1 };
  if (cp < 0x800) return { bytes: 2, units: 1 };
  // A lone surrogate is encoded as U+FFFD (3 bytes) by TextEncoder and Buffer.
  if (cp < 0x10000) return { bytes: 3, units: 1 };
  return { bytes: 4, units: 2 };
}

/**
 * The longest prefix of `text` whose UTF-8 encoding fits in `maxBytes`, never splitting a code
 * point (a surrogate pair stays whole). Grapheme clusters made of several code points (flags,
 * ZWJ emoji sequences, combining marks) may be split between their code points.
 */
export function truncateUtf8(text: string, maxBytes: number): string {
  if (!Number.isInteger(maxBytes) || maxBytes < 0) {
    throw new CorralError('invalid_argument', `maxBytes must be a non-negative integer, got ${maxBytes}`);
  }
  // Fast path: a UTF-16 unit never takes more than 3 UTF-8 bytes.
  if (text.length * 3 <= maxBytes) return text;
  let bytes = 0;
  let i = 0;
  while (i < text.length) {
    const c = codePointAt(text, i);
    if (bytes + c.bytes > maxBytes) return text.slice(0, i);
    bytes += c.bytes;
    i += c.units;
  }
  return text;
}

/** Human-readable text for anything a child threw or returned as `{ error }`. */
export function describeError(error: unknown): string {
  let text: string;
  if (error instanceof Error) {
    const code = (error as { code?: unknown }).code;
    const head = `${error.name}${typeof code === 'string' ? ` [${code}]` : ''}: ${error.message}`;
    // Rebuild the header instead of trusting the stack's first line: V8 writes it at
    // construction, before subclasses such as CorralError set their `name`.
    const frames = typeof error.stack === 'string' ? error.stack.split('\n').filter((l) => /^\s+at /.test(l)) : [];
    text = [head, ...frames].join('\n');
  } else if (typeof error === 'string') {
    text = error;
  } else {
    try {
      text = JSON.stringify(error) ?? String(error);
    } catch {
      text = String(error);
    }
  }
  return truncateUtf8(text, MAX_DIAGNOSTIC_BYTES);
}
